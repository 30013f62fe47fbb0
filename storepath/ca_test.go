package storepath_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/nix"
	. "gradient.dev/gradient/storepath"
)

// nixRun runs a Nix command on the test store n and returns its trimmed
// output.
func nixRun(t *testing.T, n *nix.Nix, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], append([]string{"--store", n.Store}, args[1:]...)...)
	cmd.Dir = n.WorkDir
	cmd.Env = append(append(os.Environ(), n.Env...), "NIX_CONFIG="+strings.Join(n.Config, "\n"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %v: %s", args, err, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

// realPaths makes content-addressed paths of every kind with the real
// Nix: sources (nix-store --add), flat and recursive fixed paths of two
// algorithms, builtins.toFile with a reference, a .drv file, and the
// output of a content-addressed derivation that references itself.
func realPaths(t *testing.T) (*nix.Nix, map[string]string) {
	n := nixtest.New(t)
	n.Config = append(slices.Clone(n.Config), "extra-experimental-features = ca-derivations")
	dir := t.TempDir()
	file := filepath.Join(dir, "hello.txt")
	tree := filepath.Join(dir, "tree")
	os.WriteFile(file, []byte("hello\n"), 0o644)
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "sub", "a"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(tree, "run"), []byte("#!/bin/sh\n"), 0o755)
	expr := filepath.Join(dir, "ca.nix")
	os.WriteFile(expr, []byte(`
let dep = builtins.toFile "dep" "D"; in {
  text = builtins.toFile "uses-dep" "see ${dep}";
  drv = derivation {
    name = "caout"; system = builtins.currentSystem; builder = "/bin/sh";
    args = ["-c" "PATH=/bin:/usr/bin; mkdir $out; echo ${dep} > $out/dep; echo $out > $out/self"];
    __contentAddressed = true; outputHashMode = "recursive"; outputHashAlgo = "sha256";
  };
}`), 0o644)
	drv := nixRun(t, n, "nix-instantiate", expr, "-A", "drv")
	return n, map[string]string{
		"source file":      nixRun(t, n, "nix-store", "--add", file),
		"source tree":      nixRun(t, n, "nix-store", "--add", tree),
		"flat sha256":      nixRun(t, n, "nix-store", "--add-fixed", "sha256", file),
		"flat sha1":        nixRun(t, n, "nix-store", "--add-fixed", "sha1", file),
		"recursive sha512": nixRun(t, n, "nix-store", "--add-fixed", "--recursive", "sha512", tree),
		"text with a ref":  nixRun(t, n, "nix", "eval", "--raw", "-f", expr, "text"),
		"drv":              drv,
		"ca output (self)": nixRun(t, n, "nix-store", "--realise", drv),
	}
}

// The paths Nix made are the paths computed from their CA fields and
// references; other references or names give other paths.
func TestStorePathIsNixs(t *testing.T) {
	n, paths := realPaths(t)
	for what, path := range paths {
		infos, err := n.PathInfo(t.Context(), path)
		if err != nil || len(infos) != 1 {
			t.Fatalf("%s: path info: %v", what, err)
		}
		info := infos[0]
		ca, err := ParseCA(info.CA)
		if err != nil {
			t.Fatalf("%s: CA %q: %v", what, info.CA, err)
		}
		if err := ca.CheckPath(path, info.References); err != nil {
			t.Errorf("%s (%s, refs %v): %v", what, info.CA, info.References, err)
		}
		// Base names are references too (docs/protocol/cache.md: relayed NARs).
		var bases []string
		for _, r := range info.References {
			bases = append(bases, strings.TrimPrefix(r, Dir+"/"))
		}
		if err := ca.CheckPath(path, bases); err != nil {
			t.Errorf("%s with base-name references: %v", what, err)
		}
		if err := ca.CheckPath(path, append(info.References, paths["source file"])); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s with an extra reference: %v, want refused", what, err)
		}
		hash, name, _ := Parse(path)
		if err := ca.CheckPath(Dir+"/"+hash+"-x"+name, info.References); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s under another name: %v, want refused", what, err)
		}
		if ca.Method != Text && len(info.References) == 0 {
			other := ContentAddress{Method: Recursive, Algo: ca.Algo, Digest: ca.Digest}
			if ca.Method == Recursive {
				other.Method = Flat
			}
			if err := other.CheckPath(path, nil); !errors.Is(err, ErrInvalid) {
				t.Errorf("%s as %s: %v, want refused", what, other, err)
			}
		}
	}
}

// The NAR of each real path verifies against its CA field, and does not
// once a byte of it changes.
func TestVerifierAcceptsNixsContent(t *testing.T) {
	n, paths := realPaths(t)
	for what, path := range paths {
		infos, err := n.PathInfo(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		ca, _ := ParseCA(infos[0].CA)
		var nar bytes.Buffer
		if err := n.DumpPath(t.Context(), path, &nar); err != nil {
			t.Fatal(err)
		}
		hash, _ := Hash(path)
		newVerifier := func() *Verifier { return NewVerifier(ca) }
		if slices.Contains(infos[0].References, path) {
			newVerifier = func() *Verifier { return NewSelfVerifier(ca, hash) }
			// Hashed modulo its own hash part, which it holds.
			plain := NewVerifier(ca)
			plain.Write(nar.Bytes())
			if plain.Check() == nil {
				t.Errorf("%s: verified without its self-reference zeroed", what)
			}
		}
		// Written in odd pieces, as a decompressor would; 7 and 31
		// bytes split the hash part at every offset somewhere.
		for _, piece := range []int{7, 31, nar.Len()} {
			v := newVerifier()
			for b := nar.Bytes(); len(b) > 0; {
				k := min(len(b), piece)
				v.Write(b[:k])
				b = b[k:]
			}
			if err := v.Check(); err != nil {
				t.Errorf("%s in pieces of %d: %v", what, piece, err)
			}
		}
		for _, at := range []int{len(nar.Bytes()) - 20, 100} {
			forged := bytes.Clone(nar.Bytes())
			forged[at] ^= 1
			v := newVerifier()
			v.Write(forged)
			if err := v.Check(); !errors.Is(err, ErrInvalid) {
				t.Errorf("%s with byte %d changed: %v, want refused", what, at, err)
			}
		}
		v := newVerifier()
		v.Write(nar.Bytes()[:nar.Len()-8])
		if err := v.Check(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s cut short: %v, want refused", what, err)
		}
	}
}

// A text or flat address certifies one non-executable file: the NAR of a
// directory or of an executable is refused whatever its hash.
func TestVerifierWantsOneFile(t *testing.T) {
	n, paths := realPaths(t)
	var tree bytes.Buffer
	if err := n.DumpPath(t.Context(), paths["source tree"], &tree); err != nil {
		t.Fatal(err)
	}
	exe := NarStrings("nix-archive-1", "(", "type", "regular", "executable", "", "contents", "x", ")")
	for _, nar := range [][]byte{tree.Bytes(), exe, append(NarStrings("nix-archive-1", "(", "type", "regular", "contents", "x", ")"), 0)} {
		for _, m := range []Method{Text, Flat} {
			v := NewVerifier(ContentAddress{Method: m, Algo: "sha256", Digest: make([]byte, 32)})
			v.Write(nar)
			if err := v.Check(); err == nil || !strings.Contains(err.Error(), "not a single non-executable regular file") {
				t.Errorf("method %d over %d NAR bytes: %v", m, len(nar), err)
			}
		}
	}
}
