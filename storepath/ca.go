package storepath

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"gradient.dev/gradient/nixbase32"
)

// Method is how a content address hashes its path.
type Method int

const (
	// Text: a single file hashed as is (text:sha256, .drv files and
	// builtins.toFile), which may reference other paths.
	Text Method = iota
	// Flat: a single file hashed as is (fixed:<algo>).
	Flat
	// Recursive: the whole NAR hashed (fixed:r:<algo>).
	Recursive
)

// ContentAddress is a parsed narinfo CA field.
type ContentAddress struct {
	Method Method
	Algo   string // md5, sha1, sha256 or sha512
	Digest []byte
}

// ParseCA parses a CA field by Nix's grammar (see CheckCA).
func ParseCA(ca string) (ContentAddress, error) {
	method, rest, _ := strings.Cut(ca, ":")
	var out ContentAddress
	switch method {
	case "text":
		out.Method = Text
		algo, _, _ := strings.Cut(rest, ":")
		if algo != "sha256" {
			return ContentAddress{}, invalid("CA %q: text content addresses use sha256", clip(ca))
		}
	case "fixed":
		out.Method = Flat
		if r, ok := strings.CutPrefix(rest, "r:"); ok {
			out.Method, rest = Recursive, r
		}
		algo, _, _ := strings.Cut(rest, ":")
		if _, ok := hashSizes[algo]; !ok {
			return ContentAddress{}, invalid("CA %q: unknown hash algorithm %q (md5, sha1, sha256, sha512)", clip(ca), clip(algo))
		}
	default:
		return ContentAddress{}, invalid("CA %q: want text:sha256:<hash>, fixed:<algo>:<hash> or fixed:r:<algo>:<hash>", clip(ca))
	}
	algo, digest, _ := strings.Cut(rest, ":")
	raw, err := decodeDigest(ca, algo, digest)
	if err != nil {
		return ContentAddress{}, err
	}
	out.Algo, out.Digest = algo, raw
	return out, nil
}

// String is the CA field in Nix's own form (the digest in nix32).
func (ca ContentAddress) String() string {
	prefix := "fixed:"
	switch ca.Method {
	case Text:
		prefix = "text:"
	case Recursive:
		prefix = "fixed:r:"
	}
	return prefix + ca.Algo + ":" + nixbase32.Encode(ca.Digest)
}

// StorePath is the path Nix gives content of this address named name
// with references (full paths or base names) and, if self, a reference to
// itself. Combinations Nix cannot produce are refused: references of a
// flat or non-SHA-256 path, a text path referencing itself.
func (ca ContentAddress) StorePath(name string, references []string, self bool) (string, error) {
	if err := checkName(name); err != nil {
		return "", invalid("name %q: %v", clip(name), err)
	}
	refs := make([]string, 0, len(references))
	for _, r := range references {
		full := Dir + "/" + strings.TrimPrefix(r, Dir+"/")
		if _, _, err := Parse(full); err != nil {
			return "", err
		}
		refs = append(refs, full)
	}
	slices.Sort(refs) // Nix's StorePathSet order
	refs = slices.Compact(refs)
	hexDigest := ca.Algo + ":" + hex.EncodeToString(ca.Digest)
	switch {
	case ca.Method == Text:
		if self {
			return "", invalid("a text content address cannot reference its own path")
		}
		return makeStorePath(makeType("text", refs, false), hexDigest, name), nil
	case ca.Method == Recursive && ca.Algo == "sha256":
		return makeStorePath(makeType("source", refs, self), hexDigest, name), nil
	case len(refs) > 0 || self:
		return "", invalid("a %s content address cannot have references", ca.describe())
	}
	prefix := ""
	if ca.Method == Recursive {
		prefix = "r:"
	}
	inner := sha256.Sum256([]byte("fixed:out:" + prefix + hexDigest + ":"))
	return makeStorePath("output:out", "sha256:"+hex.EncodeToString(inner[:]), name), nil
}

// CheckPath checks that path is the one Nix computes for this address
// from the path's name and references; a reference to path itself is its
// self-reference. It says nothing about the content (see Verifier).
func (ca ContentAddress) CheckPath(path string, references []string) error {
	hash, name, err := Parse(path)
	if err != nil {
		return err
	}
	var others []string
	self := false
	for _, r := range references {
		if h, err := Hash(r); err == nil && h == hash {
			self = true
			continue
		}
		others = append(others, r)
	}
	want, err := ca.StorePath(name, others, self)
	if err != nil {
		return invalid("%s: %v", clip(path), err)
	}
	if want != path {
		return invalid("%s is not the path of content address %s with these references (Nix computes %s)", clip(path), ca, want)
	}
	return nil
}

func (ca ContentAddress) describe() string {
	switch ca.Method {
	case Text:
		return "text"
	case Recursive:
		return "recursive " + ca.Algo
	}
	return "flat " + ca.Algo
}

// makeType is Nix's type string of a path: the kind, each reference and
// ":self" for a self-reference.
func makeType(kind string, refs []string, self bool) string {
	var b strings.Builder
	b.WriteString(kind)
	for _, r := range refs {
		b.WriteString(":" + r)
	}
	if self {
		b.WriteString(":self")
	}
	return b.String()
}

// makeStorePath is Nix's makeStorePath: the SHA-256 of
// "<type>:<algo>:<hex digest>:/nix/store:<name>", folded to 20 bytes.
func makeStorePath(typ, hexDigest, name string) string {
	sum := sha256.Sum256([]byte(typ + ":" + hexDigest + ":" + Dir + ":" + name))
	var folded [20]byte
	for i, b := range sum {
		folded[i%len(folded)] ^= b
	}
	return Dir + "/" + nixbase32.Encode(folded[:]) + "-" + name
}
