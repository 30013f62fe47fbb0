package narstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

func payload(n int) []byte {
	r := rand.New(rand.NewPCG(1, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.IntN(16)) // compressible, like most NARs
	}
	return b
}

func openStore(t *testing.T, dir string) *Local {
	t.Helper()
	s, err := OpenLocal(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readObject(t *testing.T, s Store, key string) []byte {
	t.Helper()
	rc, size, err := s.Open(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	compressed, err := io.ReadAll(rc)
	if err != nil || int64(len(compressed)) != size {
		t.Fatalf("read %d bytes of %d: %v", len(compressed), size, err)
	}
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	plain, err := dec.DecodeAll(compressed, nil)
	if err != nil {
		t.Fatal(err)
	}
	return plain
}

func TestPutOpenRoundTrip(t *testing.T) {
	s := openStore(t, t.TempDir())
	nar := payload(3<<20 + 17)
	obj, err := s.Put(t.Context(), bytes.NewReader(nar), nil)
	if err != nil {
		t.Fatal(err)
	}
	if obj.NarHash != sha256.Sum256(nar) || obj.NarSize != int64(len(nar)) {
		t.Fatalf("NAR sums %x/%d are wrong", obj.NarHash, obj.NarSize)
	}
	if obj.FileSize >= obj.NarSize || obj.Key != KeyOf(obj.FileHash) {
		t.Fatalf("object %+v", obj)
	}
	rc, _, _ := s.Open(t.Context(), obj.Key)
	compressed, _ := io.ReadAll(rc)
	rc.Close()
	if sha256.Sum256(compressed) != obj.FileHash || int64(len(compressed)) != obj.FileSize {
		t.Fatal("file sums do not match the stored bytes")
	}
	if !bytes.Equal(readObject(t, s, obj.Key), nar) {
		t.Fatal("decompressed object differs from the NAR")
	}
	// The same NAR again is the same object.
	again, err := s.Put(t.Context(), bytes.NewReader(nar), nil)
	if err != nil || again != obj {
		t.Fatalf("second put: %+v, %v", again, err)
	}
	if keys, _ := s.Keys(); len(keys) != 1 || keys[0] != obj.Key {
		t.Fatalf("keys %v", keys)
	}
	if err := s.Delete(t.Context(), obj.Key); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Open(t.Context(), obj.Key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open after delete: %v", err)
	}
	if _, _, err := s.Open(t.Context(), "../../etc/passwd"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open of a bad key: %v", err)
	}
}

// assertEmpty checks that no object and no temporary file is visible.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	var files []string
	filepath.WalkDir(filepath.Join(dir, "nars"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 0 {
		t.Fatalf("files left in the store: %v", files)
	}
}

// failingReader yields n bytes of data, then an error.
type failingReader struct {
	data []byte
	n    int
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("connection reset")
	}
	k := copy(p, f.data[:min(len(f.data), f.n, len(p))])
	f.data, f.n = f.data[k:], f.n-k
	return k, nil
}

func TestInterruptedPutLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	nar := payload(2 << 20)
	if _, err := s.Put(t.Context(), &failingReader{data: nar, n: 1 << 20}, nil); err == nil {
		t.Fatal("put from a failing reader succeeded")
	}
	assertEmpty(t, dir)

	refused := errors.New("hash mismatch")
	if _, err := s.Put(t.Context(), bytes.NewReader(nar), func(Object) error { return refused }); !errors.Is(err, refused) {
		t.Fatalf("verify refusal: %v", err)
	}
	assertEmpty(t, dir)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Put(ctx, bytes.NewReader(nar), nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled put: %v", err)
	}
	assertEmpty(t, dir)

	obj, err := s.Put(t.Context(), bytes.NewReader(nar), nil)
	if err != nil || !bytes.Equal(readObject(t, s, obj.Key), nar) {
		t.Fatalf("put after failures: %v", err)
	}
}

// TestKilledWriterLeavesNoObject kills a process in the middle of a put:
// the store shows no object, the next start removes a temporary file it
// left (named staging), and the same NAR then stores fine.
func TestKilledWriterLeavesNoObject(t *testing.T) {
	if dir := os.Getenv("NARSTORE_CRASH_DIR"); dir != "" {
		crashingWriter(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWriterLeavesNoObject$")
	cmd.Env = append(os.Environ(), "NARSTORE_CRASH_DIR="+dir)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child prints a line once it has written part of the NAR.
	line := make([]byte, 8)
	if _, err := io.ReadAtLeast(stdout, line, 8); err != nil {
		t.Fatalf("child did not start writing: %v", err)
	}
	cmd.Process.Kill()
	cmd.Wait()

	// Unnamed staging files leave nothing behind; named ones leave the
	// killed put's temporary file.
	want := 1
	if probeUnnamed(filepath.Join(dir, "nars")) {
		want = 0
	}
	temps, _ := filepath.Glob(filepath.Join(dir, "nars", tempPattern))
	if len(temps) != want {
		t.Fatalf("want %d temporary files after the killed put, found %v", want, temps)
	}
	if keys, _ := openStoreKeysWithoutCleanup(dir); len(keys) != 0 {
		t.Fatalf("a killed put left visible objects %v", keys)
	}
	s := openStore(t, dir) // start-up cleans the leftover
	assertEmpty(t, dir)
	nar := payload(4 << 20)
	obj, err := s.Put(t.Context(), bytes.NewReader(nar), nil)
	if err != nil || !bytes.Equal(readObject(t, s, obj.Key), nar) {
		t.Fatalf("put after the crash: %v", err)
	}
}

func openStoreKeysWithoutCleanup(dir string) ([]string, error) {
	return (&Local{nars: filepath.Join(dir, "nars")}).Keys()
}

// crashingWriter puts a NAR that stalls halfway; the parent kills it.
func crashingWriter(dir string) {
	s, err := OpenLocal(dir, nil)
	if err != nil {
		os.Exit(3)
	}
	nar := payload(4 << 20)
	r := io.MultiReader(bytes.NewReader(nar[:2<<20]), &stall{})
	s.Put(context.Background(), r, nil)
	os.Exit(4) // not reached: the stall never ends
}

// stall announces that the first half went through, then blocks.
type stall struct{ said bool }

func (s *stall) Read(p []byte) (int, error) {
	if !s.said {
		s.said = true
		os.Stdout.WriteString("writing\n")
	}
	time.Sleep(time.Hour)
	return 0, io.EOF
}
