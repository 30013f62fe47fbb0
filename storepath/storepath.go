// Package storepath checks Nix store paths and the content-address field
// of narinfo files by Nix's own rules, so that nothing the server signs
// into a narinfo is a value Nix itself would refuse (or a line break that
// would smuggle in a field of its own).
package storepath

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"gradient.dev/gradient/nixbase32"
)

// Dir is the only store directory the server deals in.
const Dir = "/nix/store"

// HashLen is the length of a store path's hash part: 160 bits in nix32.
const HashLen = 32

// MaxNameLen is the longest name Nix accepts (StorePath::MaxPathLen).
const MaxNameLen = 211

// ErrInvalid marks every refusal of this package (errors.Is); the
// messages themselves say only what is wrong, for callers to prefix.
var ErrInvalid = errors.New("invalid")

type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }
func (e *invalidError) Unwrap() error { return ErrInvalid }

func invalid(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// ParseBase splits a base name <hash>-<name> and checks both parts.
func ParseBase(base string) (hash, name string, err error) {
	hash, name, ok := strings.Cut(base, "-")
	if !ok || len(hash) != HashLen {
		return "", "", invalid("%q is not a store path: want %s/<32-character hash>-<name>", clip(base), Dir)
	}
	if _, err := nixbase32.Decode(hash); err != nil {
		return "", "", invalid("store path %q: hash part is not nix32", clip(base))
	}
	if err := checkName(name); err != nil {
		return "", "", invalid("store path %q: %v", clip(base), err)
	}
	return hash, name, nil
}

// Parse checks a full path /nix/store/<hash>-<name> and returns its parts.
func Parse(path string) (hash, name string, err error) {
	base, ok := strings.CutPrefix(path, Dir+"/")
	if !ok {
		return "", "", invalid("%q is not a store path under %s", clip(path), Dir)
	}
	return ParseBase(base)
}

// Base returns the base name of a full store path or of a base name,
// checking it either way.
func Base(path string) (string, error) {
	base := strings.TrimPrefix(path, Dir+"/")
	if _, _, err := ParseBase(base); err != nil {
		return "", err
	}
	return base, nil
}

// Hash returns the hash part of a full store path or of a base name.
func Hash(path string) (string, error) {
	hash, _, err := ParseBase(strings.TrimPrefix(path, Dir+"/"))
	return hash, err
}

// checkName applies Nix's name rule: 1 to 211 characters of
// [A-Za-z0-9+-._?=], not starting with a dot.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name is %d characters, Nix allows %d", len(name), MaxNameLen)
	case name[0] == '.':
		return errors.New("name starts with '.'")
	}
	for i := 0; i < len(name); i++ {
		if !nameChar(name[i]) {
			return fmt.Errorf("name has the character %q (allowed: A-Z a-z 0-9 + - . _ ? =)", name[i])
		}
	}
	return nil
}

func nameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("+-._?=", c) >= 0
}

// hashSizes are the digest lengths of the algorithms a content address may name.
var hashSizes = map[string]int{"md5": 16, "sha1": 20, "sha256": 32, "sha512": 64}

// CheckCA checks a narinfo CA field by Nix's grammar:
// text:sha256:<hash>, fixed:<algo>:<hash> or fixed:r:<algo>:<hash>, the
// hash in nix32, hex or base64 of the algorithm's digest length.
func CheckCA(ca string) error {
	_, err := ParseCA(ca)
	return err
}

// decodeDigest reads a digest of algo in nix32, hex or base64.
func decodeDigest(ca, algo, digest string) ([]byte, error) {
	size := hashSizes[algo]
	var raw []byte
	var err error
	switch len(digest) {
	case nixbase32.EncodedLen(size):
		raw, err = nixbase32.Decode(digest)
	case hex.EncodedLen(size):
		raw, err = hex.DecodeString(digest)
	case base64.StdEncoding.EncodedLen(size):
		raw, err = base64.StdEncoding.DecodeString(digest)
	default:
		err = errors.New("wrong length")
	}
	if err != nil || len(raw) != size {
		return nil, invalid("CA %q: %q is not a %s digest (nix32, hex or base64)", clip(ca), clip(digest), algo)
	}
	return raw, nil
}

// clip keeps error messages short when the input is not.
func clip(s string) string {
	const most = 300
	if len(s) <= most {
		return s
	}
	return s[:most] + "…"
}
