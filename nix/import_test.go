package nix

import (
	"bytes"
	"crypto/sha256"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/nixbase32"
)

// importFixture adds to a store a source file, a .drv using it and the
// built output referring to it, and returns their imports (NARs dumped and
// zstd-compressed) in the order src, drv, out.
func importFixture(t *testing.T, n *Nix) []NarImport {
	t.Helper()
	ctx := testContext(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "src.txt"), []byte("imported source\n"), 0o644)
	expr := `derivation { name = "uses-src"; system = "x86_64-linux"; builder = "/bin/sh";
	  args = [ "-c" "echo ${./src.txt} > $out" ]; }`
	os.WriteFile(filepath.Join(dir, "default.nix"), []byte(expr), 0o644)
	out, err := n.output(ctx, "nix-instantiate", filepath.Join(dir, "default.nix"))
	if err != nil {
		t.Fatal(err)
	}
	drv := strings.TrimSpace(string(out))
	outputs, err := n.Build(ctx, drv, BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := n.Derivation(ctx, drv)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.InputSrcs) != 1 {
		t.Fatalf("input sources %v", d.InputSrcs)
	}
	paths := []string{d.InputSrcs[0], drv, outputs["out"]}
	infos, err := n.PathInfo(ctx, paths...)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	var items []NarImport
	for i, info := range infos {
		var nar bytes.Buffer
		if err := n.DumpPath(ctx, info.Path, &nar); err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(nar.Bytes()); "sha256:"+nixbase32.Encode(sum[:]) != info.NarHash {
			t.Fatalf("dumped NAR of %s does not match its hash %s", info.Path, info.NarHash)
		}
		file := filepath.Join(dir, filepath.Base(info.Path)+".nar.zst")
		if err := os.WriteFile(file, enc.EncodeAll(nar.Bytes(), nil), 0o644); err != nil {
			t.Fatal(err)
		}
		narHash, err := info.NarHashNix32()
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, NarImport{
			StorePath: paths[i], NarHash: narHash, NarSize: info.NarSize,
			References: info.References, Deriver: info.Deriver, CA: info.CA, NarZst: file,
		})
	}
	return items
}

func TestImportNARs(t *testing.T) {
	ctx := testContext(t)
	items := importFixture(t, newTestNix(t))
	src, drv, out := items[0], items[1], items[2]
	if src.CA == "" || !slices.Equal(out.References, []string{src.StorePath}) || out.Deriver != drv.StorePath {
		t.Fatalf("fixture %+v", items)
	}

	t.Run("closure", func(t *testing.T) {
		n := newTestNix(t)
		// Out of order on purpose: Nix sorts by references.
		if err := n.ImportNARs(ctx, []NarImport{out, drv, src}); err != nil {
			t.Fatal(err)
		}
		infos, err := n.PathInfo(ctx, src.StorePath, drv.StorePath, out.StorePath)
		if err != nil {
			t.Fatal(err)
		}
		for i, info := range infos {
			want := items[i]
			got, _ := info.NarHashNix32()
			if got != want.NarHash || info.NarSize != want.NarSize || !slices.Equal(info.References, want.References) ||
				info.Deriver != want.Deriver || info.CA != want.CA {
				t.Errorf("imported %+v, want %+v", info, want)
			}
		}
		// Importing valid paths again is a no-op.
		if err := n.ImportNARs(ctx, items); err != nil {
			t.Errorf("re-import: %v", err)
		}
		if entries, _ := filepath.Glob(filepath.Join(n.WorkDir, "nar-import-*")); len(entries) != 0 {
			t.Errorf("temporary caches left: %v", entries)
		}
	})

	t.Run("wrong hash", func(t *testing.T) {
		n := newTestNix(t)
		bad := src
		bad.NarHash = out.NarHash
		err := n.ImportNARs(ctx, []NarImport{bad})
		if err == nil || !strings.Contains(err.Error(), src.StorePath) || !strings.Contains(err.Error(), "hash mismatch") {
			t.Errorf("import with a wrong hash: %v", err)
		}
		if valid, err := n.ValidPaths(ctx, src.StorePath); err != nil || len(valid) != 0 {
			t.Errorf("after a failed import valid %v %v", valid, err)
		}
	})

	t.Run("missing reference", func(t *testing.T) {
		n := newTestNix(t)
		err := n.ImportNARs(ctx, []NarImport{out})
		if err == nil || !strings.Contains(err.Error(), "neither imported nor valid") || !strings.Contains(err.Error(), src.StorePath) {
			t.Errorf("import without its reference: %v", err)
		}
		// With the reference valid, the rest imports alone.
		if err := n.ImportNARs(ctx, []NarImport{src}); err != nil {
			t.Fatal(err)
		}
		if err := n.ImportNARs(ctx, []NarImport{out}); err != nil {
			t.Errorf("import with its reference valid: %v", err)
		}
	})
}

func TestVersionOfInstalledNix(t *testing.T) {
	n := newTestNix(t)
	v, err := n.Version(testContext(t))
	if err != nil || !v.AtLeast(2, 8) {
		t.Fatalf("version %v %v", v, err)
	}
	n.BinDir = t.TempDir() // cached: no second run
	if again, err := n.Version(testContext(t)); err != nil || again != v {
		t.Errorf("second call %v %v", again, err)
	}
}
