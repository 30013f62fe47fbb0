package narstore

import (
	"crypto/sha256"
	"errors"
	"runtime"
	"testing"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/internal/zstdbound/zstdboundtest"
)

func commit(t *testing.T, s *Local, zst []byte, verify func(Object) error) (Object, error) {
	t.Helper()
	u, err := s.Create(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.Write(zst); err != nil {
		t.Fatal(err)
	}
	return u.Commit(t.Context(), nil, verify)
}

// A worker's upload whose frame declares a window beyond the bound is
// corrupt (the server rejects it), not decoded with a window of its
// choosing; within the bound the same NAR commits.
func TestCommitRefusesWindowsBeyondTheBound(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	nar := payload(300 << 10)
	for name, zst := range map[string][]byte{
		"256 MiB window":       zstdboundtest.WithWindowLog(28, nar),
		"2 GiB window":         zstdboundtest.WithWindowLog(31, nar),
		"3 GiB single segment": zstdboundtest.SingleSegment(3<<30, nar),
	} {
		if _, err := commit(t, s, zst, nil); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	assertEmpty(t, dir)
	obj, err := commit(t, s, zstdboundtest.WithWindowLog(27, nar), nil)
	if err != nil || obj.NarHash != sha256.Sum256(nar) {
		t.Fatalf("128 MiB window: %+v, %v", obj, err)
	}
}

// A decompression bomb (a few KiB expanding to 256 MiB) streams through
// the hash: Commit allocates a window's worth, not the NAR.
func TestCommitStreamsABomb(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	enc, _ := zstd.NewWriter(nil)
	bomb := enc.EncodeAll(make([]byte, 256<<20), nil)
	enc.Close()
	if len(bomb) > 1<<20 {
		t.Fatalf("the bomb is %d bytes", len(bomb))
	}
	refused := errors.New("NAR size is not the announced 1 TiB")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	obj, err := commit(t, s, bomb, func(o Object) error {
		if o.NarSize != 1<<40 {
			return refused
		}
		return nil
	})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, refused) {
		t.Fatalf("bomb: %+v, %v", obj, err)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20 {
		t.Errorf("committing the bomb allocated %d MiB", grown>>20)
	}
	assertEmpty(t, dir)
}
