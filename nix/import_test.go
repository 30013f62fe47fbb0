package nix

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/internal/zstdbound/zstdboundtest"
	"gradient.dev/gradient/nix/narsig"
	"gradient.dev/gradient/nixbase32"
)

// testSigner is a key set trusting one new key, and a function signing
// an import's metadata with it.
func testSigner(t *testing.T, name string) (*narsig.Keys, func(NarImport) string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys := &narsig.Keys{}
	keys.Add(narsig.PublicKey{Name: name, Key: pub})
	return keys, func(it NarImport) string {
		fp := narsig.Fingerprint(it.StorePath, it.NarHash, uint64(it.NarSize), it.References)
		return name + ":" + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, fp))
	}
}

// importFixture adds to a store a source file, a .drv using it and the
// built output referring to it, and returns their imports in the order
// src, drv, out with their NARs zstd-compressed.
func importFixture(t *testing.T, n *Nix) ([]NarImport, map[string][]byte) {
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
	objects := map[string][]byte{}
	for i, info := range infos {
		var nar bytes.Buffer
		if err := n.DumpPath(ctx, info.Path, &nar); err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(nar.Bytes()); "sha256:"+nixbase32.Encode(sum[:]) != info.NarHash {
			t.Fatalf("dumped NAR of %s does not match its hash %s", info.Path, info.NarHash)
		}
		objects[paths[i]] = enc.EncodeAll(nar.Bytes(), nil)
		narHash, err := info.NarHashNix32()
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, NarImport{
			StorePath: paths[i], NarHash: narHash, NarSize: info.NarSize,
			References: info.References, Deriver: info.Deriver, CA: info.CA,
		})
	}
	return items, objects
}

func zstdDecodeAll(b []byte) ([]byte, error) {
	dec, err := zstd.NewReader(nil)
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	return dec.DecodeAll(b, nil)
}

// failAtEnd yields r's bytes, then err instead of the end: a stream
// whose last check (the compressed object's hash) failed.
type failAtEnd struct {
	r   io.Reader
	err error
}

func (f failAtEnd) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		err = f.err
	}
	return n, err
}

func TestImportNAR(t *testing.T) {
	// Longer than testContext: one context for every subtest, and the
	// decompression bomb hashes 256 MiB, slow under -race on a busy
	// machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	items, objects := importFixture(t, newTestNix(t))
	keys, signer := testSigner(t, "test-cache-1")
	items[2].Signatures = []string{signer(items[2])}
	newTestNix := func(t *testing.T) *Nix {
		n := newTestNix(t)
		n.TrustedKeys = keys
		return n
	}
	src, drv, out := items[0], items[1], items[2]
	if src.CA == "" || !slices.Equal(out.References, []string{src.StorePath}) || out.Deriver != drv.StorePath {
		t.Fatalf("fixture %+v", items)
	}
	object := func(it NarImport) io.Reader { return bytes.NewReader(objects[it.StorePath]) }
	notValid := func(t *testing.T, n *Nix, path string) {
		t.Helper()
		if valid, err := n.ValidPaths(ctx, path); err != nil || len(valid) != 0 {
			t.Errorf("after a failed import valid %v %v", valid, err)
		}
	}

	t.Run("closure", func(t *testing.T) {
		n := newTestNix(t)
		for _, it := range items {
			if err := n.ImportNAR(ctx, it, object(it)); err != nil {
				t.Fatal(err)
			}
		}
		infos, err := n.PathInfo(ctx, src.StorePath, drv.StorePath, out.StorePath)
		if err != nil {
			t.Fatal(err)
		}
		for i, info := range infos {
			want := items[i]
			got, _ := info.NarHashNix32()
			if got != want.NarHash || info.NarSize != want.NarSize || !slices.Equal(info.References, want.References) ||
				info.Deriver != want.Deriver || info.CA != want.CA || info.Ultimate {
				t.Errorf("imported %+v, want %+v", info, want)
			}
		}
		// Importing a valid path again changes nothing.
		if err := n.ImportNAR(ctx, out, object(out)); err != nil {
			t.Errorf("re-import: %v", err)
		}
	})

	t.Run("wrong hash", func(t *testing.T) {
		n := newTestNix(t)
		bad := src
		bad.NarHash = out.NarHash
		err := n.ImportNAR(ctx, bad, object(src))
		var mismatch *NarMismatchError
		if !errors.As(err, &mismatch) || mismatch.Path != src.StorePath || !strings.Contains(err.Error(), "content address") {
			t.Errorf("import with a hash other than its content address: %v", err)
		}
		// Without the CA (the store taking unsigned paths), the stream's
		// own hash check refuses it.
		n.ImportUnsigned = true
		bad.CA = ""
		err = n.ImportNAR(ctx, bad, object(src))
		if !errors.As(err, &mismatch) || mismatch.Path != src.StorePath || !strings.Contains(err.Error(), "hash sha256:") {
			t.Errorf("import with a wrong hash: %v", err)
		}
		n.ImportUnsigned = false
		notValid(t, n, src.StorePath)
		// The connection's failure did not end the store's others.
		if err := n.ImportNAR(ctx, src, object(src)); err != nil {
			t.Errorf("import after a refused one: %v", err)
		}
	})

	t.Run("wrong size", func(t *testing.T) {
		n := newTestNix(t)
		for _, size := range []int64{src.NarSize - 8, src.NarSize + 8} {
			bad := src
			bad.NarSize = size
			var mismatch *NarMismatchError
			if err := n.ImportNAR(ctx, bad, object(src)); !errors.As(err, &mismatch) {
				t.Errorf("import announcing %d of %d bytes: %v", size, src.NarSize, err)
			}
		}
		notValid(t, n, src.StorePath)
	})

	t.Run("stream fails at its end", func(t *testing.T) {
		// Every NAR byte but the held-back tail reached the daemon; the
		// stream's failure still keeps the path out of the store.
		n := newTestNix(t)
		broken := errors.New("the object's hash is wrong")
		err := n.ImportNAR(ctx, src, failAtEnd{object(src), broken})
		if !errors.Is(err, broken) {
			t.Errorf("import of a failing stream: %v", err)
		}
		notValid(t, n, src.StorePath)
	})

	t.Run("not zstd", func(t *testing.T) {
		n := newTestNix(t)
		if err := n.ImportNAR(ctx, src, strings.NewReader("plain bytes, not a zstd frame")); err == nil {
			t.Error("import of garbage succeeded")
		}
		notValid(t, n, src.StorePath)
	})

	t.Run("window beyond the bound", func(t *testing.T) {
		// A hostile server or proxy declares a window the worker would
		// have to allocate: the pull fails as for a corrupt object.
		n := newTestNix(t)
		plain, err := zstdDecodeAll(objects[src.StorePath])
		if err != nil {
			t.Fatal(err)
		}
		frames := map[string][]byte{
			"256 MiB window":       zstdboundtest.WithWindowLog(28, plain),
			"2 GiB window":         zstdboundtest.WithWindowLog(31, plain),
			"3 GiB single segment": zstdboundtest.SingleSegment(3<<30, plain),
		}
		for name, frame := range frames {
			err := n.ImportNAR(ctx, src, bytes.NewReader(frame))
			var mismatch *NarMismatchError
			if !errors.As(err, &mismatch) || mismatch.Path != src.StorePath || !strings.Contains(err.Error(), "window") {
				t.Errorf("%s: %v, want a NarMismatchError about the window", name, err)
			}
			notValid(t, n, src.StorePath)
		}
		// Within the bound the same NAR imports.
		if err := n.ImportNAR(ctx, src, bytes.NewReader(zstdboundtest.WithWindowLog(27, plain))); err != nil {
			t.Errorf("128 MiB window: %v", err)
		}
	})

	t.Run("decompression bomb", func(t *testing.T) {
		// A few KiB expanding to 256 MiB, announced as a 1 TiB NAR:
		// refused, streamed through fixed buffers rather than held.
		n := newTestNix(t)
		plain, err := zstdDecodeAll(objects[src.StorePath])
		if err != nil {
			t.Fatal(err)
		}
		enc, _ := zstd.NewWriter(nil)
		bomb := enc.EncodeAll(append(plain, make([]byte, 256<<20)...), nil)
		enc.Close()
		if len(bomb) > 1<<20 {
			t.Fatalf("the bomb is %d bytes", len(bomb))
		}
		huge := src
		huge.NarSize = 1 << 40
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if err := n.ImportNAR(ctx, huge, bytes.NewReader(bomb)); err == nil {
			t.Error("the bomb was imported")
		}
		runtime.ReadMemStats(&after)
		if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20 {
			t.Errorf("importing the bomb allocated %d MiB", grown>>20)
		}
		notValid(t, n, src.StorePath)
	})

	t.Run("missing reference", func(t *testing.T) {
		n := newTestNix(t)
		if err := n.ImportNAR(ctx, out, object(out)); err == nil || !strings.Contains(err.Error(), src.StorePath+"' is not valid") {
			t.Errorf("import without its reference: %v", err)
		}
		notValid(t, n, out.StorePath)
		if err := n.ImportNAR(ctx, src, object(src)); err != nil {
			t.Fatal(err)
		}
		if err := n.ImportNAR(ctx, out, object(out)); err != nil {
			t.Errorf("import with its reference valid: %v", err)
		}
	})
}

// The verifier passes a NAR on, but its last bytes only after the source
// ended and matched: a stream that fails at its end has not given the
// daemon a complete NAR.
func TestNarVerifierHoldsBackTheEnd(t *testing.T) {
	nar := bytes.Repeat([]byte("0123456789abcdef"), 10000) // 160,000 bytes, read in several pieces
	sum := sha256.Sum256(nar)
	for _, tc := range []struct {
		name      string
		src       io.Reader
		size      int64
		want      []byte
		delivered int // bytes Read returns before the error
		err       string
	}{
		{"intact", bytes.NewReader(nar), int64(len(nar)), sum[:], len(nar), ""},
		{"source fails at its end", failAtEnd{bytes.NewReader(nar), errors.New("object hash wrong")}, int64(len(nar)), sum[:], len(nar) - holdBack, "object hash wrong"},
		{"wrong hash", bytes.NewReader(nar), int64(len(nar)), make([]byte, 32), len(nar) - holdBack, "hash sha256:"},
		{"shorter than announced", bytes.NewReader(nar), int64(len(nar)) + 1, sum[:], len(nar) - holdBack, "announced"},
		{"longer than announced", bytes.NewReader(nar), int64(len(nar)) - 100, sum[:], -1, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newNarVerifier(tc.src, "/nix/store/x", tc.want, tc.size)
			got, err := io.ReadAll(v)
			switch {
			case tc.err == "" && (err != nil || !bytes.Equal(got, nar)):
				t.Errorf("read %d bytes, %v", len(got), err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one saying %q", err, tc.err)
			case tc.err != "" && len(got) >= len(nar)-8:
				t.Errorf("delivered %d of %d bytes: the NAR's closing token went out", len(got), len(nar))
			case tc.delivered >= 0 && len(got) != tc.delivered:
				t.Errorf("delivered %d bytes before the end, want %d", len(got), tc.delivered)
			case tc.delivered < 0 && int64(len(got)) > tc.size-holdBack:
				t.Errorf("delivered %d bytes of an over-long NAR announced at %d", len(got), tc.size)
			}
		})
	}
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

// TestImportTrust is what a server (or a proxy) can make the store hold
// through a pull: an input-addressed path only with a signature by a
// trusted key, a content-addressed one only when name and content match
// its CA. A refused path is not valid afterwards.
func TestImportTrust(t *testing.T) {
	ctx := testContext(t)
	items, objects := importFixture(t, newTestNix(t))
	src, out := items[0], items[2]
	object := func(it NarImport) io.Reader { return bytes.NewReader(objects[it.StorePath]) }
	keys, signer := testSigner(t, "test-cache-1")
	_, otherSigner := testSigner(t, "test-cache-1") // same name, another key
	// prepared is a store holding out's reference, trusting keys.
	prepared := func(t *testing.T) *Nix {
		n := newTestNix(t)
		n.TrustedKeys = keys
		if err := n.ImportNAR(ctx, src, object(src)); err != nil {
			t.Fatalf("content-addressed source without a signature: %v", err)
		}
		return n
	}
	refused := func(t *testing.T, n *Nix, it NarImport) *UntrustedPathError {
		t.Helper()
		err := n.ImportNAR(ctx, it, object(it))
		var untrusted *UntrustedPathError
		if !errors.As(err, &untrusted) || untrusted.Path != it.StorePath {
			t.Fatalf("import: %v, want an UntrustedPathError", err)
		}
		if valid, err := n.ValidPaths(ctx, it.StorePath); err != nil || len(valid) != 0 {
			t.Errorf("after a refused import valid %v %v", valid, err)
		}
		return untrusted
	}

	t.Run("unsigned input-addressed path refused", func(t *testing.T) {
		n := prepared(t)
		err := refused(t, n, out)
		if !strings.Contains(err.Error(), "no signature") || !strings.Contains(err.Error(), "--trusted-public-keys") {
			t.Errorf("message %q does not say why and what to do", err)
		}
	})
	t.Run("wrongly signed input-addressed paths refused", func(t *testing.T) {
		n := prepared(t)
		other := out
		other.NarSize++
		for name, sig := range map[string]string{
			"another key of the trusted name": otherSigner(out),
			"other metadata":                  signer(other),
			"garbage":                         "test-cache-1:AAAA",
		} {
			bad := out
			bad.Signatures = []string{sig}
			if err := refused(t, n, bad); !strings.Contains(err.Error(), "do not verify") {
				t.Errorf("%s: %v", name, err)
			}
		}
		// Without the key, even its good signature is refused.
		bare := newTestNix(t)
		if err := bare.ImportNAR(ctx, src, object(src)); err != nil {
			t.Fatal(err)
		}
		signed := out
		signed.Signatures = []string{signer(out)}
		if err := refused(t, bare, signed); !strings.Contains(err.Error(), "do not verify") {
			t.Errorf("without keys: %v", err)
		}
	})
	t.Run("signed by a trusted key", func(t *testing.T) {
		n := prepared(t)
		signed := out
		signed.Signatures = []string{"unknown-1:AAAA", signer(out)}
		if err := n.ImportNAR(ctx, signed, object(out)); err != nil {
			t.Fatal(err)
		}
		infos, err := n.PathInfo(ctx, out.StorePath)
		if err != nil {
			t.Fatal(err)
		}
		// The store records the signature that verified, not the junk.
		if !slices.Equal(infos[0].Signatures, signed.Signatures[1:]) {
			t.Errorf("recorded signatures %v", infos[0].Signatures)
		}
	})
	t.Run("a key of Nix's own trusted-public-keys", func(t *testing.T) {
		n := newTestNix(t)
		n.Config = append(slices.Clone(n.Config), "trusted-public-keys = "+keys.List()[0].String())
		if err := n.ImportNAR(ctx, src, object(src)); err != nil {
			t.Fatal(err)
		}
		signed := out
		signed.Signatures = []string{signer(out)}
		if err := n.ImportNAR(ctx, signed, object(out)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("signed by real Nix", func(t *testing.T) {
		// A signature Nix made verifies: the fingerprint is Nix's.
		source := newTestNix(t)
		for _, it := range items {
			if it.StorePath == out.StorePath {
				break
			}
			if err := source.ImportNAR(ctx, it, object(it)); err != nil {
				t.Fatal(err)
			}
		}
		source.ImportUnsigned = true
		if err := source.ImportNAR(ctx, out, object(out)); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		sk, pk := filepath.Join(dir, "sk"), filepath.Join(dir, "pk")
		if _, err := source.output(ctx, "nix-store", "--generate-binary-cache-key", "real-nix-1", sk, pk); err != nil {
			t.Fatal(err)
		}
		if _, err := source.output(ctx, "nix", "store", "sign", "--key-file", sk, out.StorePath); err != nil {
			t.Fatal(err)
		}
		infos, err := source.PathInfo(ctx, out.StorePath)
		if err != nil || len(infos[0].Signatures) != 1 {
			t.Fatalf("signed path info %+v %v", infos, err)
		}
		public, _ := os.ReadFile(pk)
		realKeys, err := narsig.ParseKeys(string(public))
		if err != nil {
			t.Fatal(err)
		}
		n := prepared(t)
		n.TrustedKeys = realKeys
		signed := out
		signed.Signatures = infos[0].Signatures
		if err := n.ImportNAR(ctx, signed, object(out)); err != nil {
			t.Fatalf("a path real Nix signed: %v", err)
		}
	})
	t.Run("unsigned accepted only when the store takes them", func(t *testing.T) {
		n := prepared(t)
		n.ImportUnsigned = true
		if err := n.ImportNAR(ctx, out, object(out)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("content address must name the path", func(t *testing.T) {
		// An input-addressed path claiming a CA (the planted path's way
		// around the signature): refused before the daemon sees it.
		n := prepared(t)
		claimed := out
		claimed.CA = src.CA
		var mismatch *NarMismatchError
		if err := n.ImportNAR(ctx, claimed, object(out)); !errors.As(err, &mismatch) || !strings.Contains(err.Error(), "content address") {
			t.Errorf("an input-addressed path with a CA: %v", err)
		}
		if valid, _ := n.ValidPaths(ctx, out.StorePath); len(valid) != 0 {
			t.Error("the path is valid")
		}
	})
	t.Run("content must match the content address", func(t *testing.T) {
		// The source's name and CA with another NAR (its hash announced
		// correctly): the CA check refuses it.
		n := newTestNix(t)
		other := src
		other.NarHash, other.NarSize = out.NarHash, out.NarSize
		var mismatch *NarMismatchError
		if err := n.ImportNAR(ctx, other, object(out)); !errors.As(err, &mismatch) || !strings.Contains(err.Error(), "content address") {
			t.Errorf("another content under a CA: %v", err)
		}
		if valid, _ := n.ValidPaths(ctx, src.StorePath); len(valid) != 0 {
			t.Error("the path is valid")
		}
		// A text address (the .drv's) is checked against the file the
		// NAR holds, as it streams.
		if err := n.ImportNAR(ctx, src, object(src)); err != nil {
			t.Fatal(err)
		}
		drv := items[1]
		text := drv
		text.NarHash, text.NarSize = src.NarHash, src.NarSize
		if err := n.ImportNAR(ctx, text, object(src)); !errors.As(err, &mismatch) || !strings.Contains(err.Error(), "content address") {
			t.Errorf("another file under a text CA: %v", err)
		}
		if valid, _ := n.ValidPaths(ctx, drv.StorePath); len(valid) != 0 {
			t.Error("the .drv is valid")
		}
		if err := n.ImportNAR(ctx, drv, object(drv)); err != nil {
			t.Errorf("the real .drv, unsigned: %v", err)
		}
	})
}

// An import holds its daemon connection while its NAR arrives, at the
// pace of a download: more stalled imports than the store operations'
// pool has connections leave a store query answered.
func TestStalledImportsDoNotHoldUpStoreQueries(t *testing.T) {
	ctx := testContext(t)
	items, objects := importFixture(t, newTestNix(t))
	src := items[0] // content-addressed: vouches for itself
	n := newTestNix(t)
	const imports = 6 // more than the store operations' pool (4)
	errs := make(chan error, imports)
	var writers []*io.PipeWriter
	for range imports {
		r, w := io.Pipe()
		writers = append(writers, w)
		go func() {
			// All but the object's last bytes, then a stall.
			obj := objects[src.StorePath]
			w.Write(obj[:len(obj)-8])
		}()
		go func() { errs <- n.ImportNAR(ctx, src, r) }()
	}
	defer func() {
		for _, w := range writers {
			w.CloseWithError(errors.New("test over"))
		}
	}()
	time.Sleep(time.Second) // the imports take their connections
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := n.ValidPaths(qctx, src.StorePath); err != nil {
		t.Fatalf("a store query while %d imports stall: %v, want its answer at once", imports, err)
	}
	for _, w := range writers {
		w.CloseWithError(errors.New("download failed"))
	}
	for range imports {
		if err := <-errs; err == nil {
			t.Error("an import whose download failed succeeded")
		}
	}
}
