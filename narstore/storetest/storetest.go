// Package storetest is the contract every narstore.Store passes: Local and
// the S3 store run the same tests, so the server may use either.
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/narstore"
)

// Fixture is a store under test and a way to list what it holds.
type Fixture struct {
	Store narstore.Store
	// Keys lists the visible objects' keys.
	Keys func(t *testing.T) []string
	// Leftovers lists anything else the store holds (staging files,
	// unfinished uploads): it must be empty after a refused or failed
	// write. Nil if the store cannot tell.
	Leftovers func(t *testing.T) []string
}

// Payload is n bytes of repeatable, compressible test data.
func Payload(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefgh"[r.IntN(8)]
	}
	return b
}

// Compressed is nar compressed as workers do.
func Compressed(t testing.TB, nar []byte) []byte {
	var buf bytes.Buffer
	if _, err := narstore.Compress(context.Background(), &buf, bytes.NewReader(nar)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ReadNAR opens key and decompresses it.
func ReadNAR(t testing.TB, s narstore.Store, key string) []byte {
	t.Helper()
	r, size, err := s.Open(context.Background(), key)
	if err != nil {
		t.Fatalf("open %s: %v", key, err)
	}
	defer r.Close()
	zst, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	if int64(len(zst)) != size {
		t.Fatalf("open said %d bytes, read %d", size, len(zst))
	}
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	nar, err := dec.DecodeAll(zst, nil)
	if err != nil {
		t.Fatalf("object %s is not zstd: %v", key, err)
	}
	return nar
}

// Run runs the contract against a fresh fixture per subtest.
func Run(t *testing.T, open func(t *testing.T) Fixture) {
	ctx := context.Background()
	assertOnly := func(t *testing.T, f Fixture, want ...string) {
		t.Helper()
		got := f.Keys(t)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("store holds %q, want %q", got, want)
		}
		if f.Leftovers != nil {
			if left := f.Leftovers(t); len(left) > 0 {
				t.Fatalf("store keeps leftovers %q", left)
			}
		}
	}

	t.Run("PutOpenRoundTrip", func(t *testing.T) {
		f := open(t)
		nar := Payload(1, 300<<10)
		obj, err := f.Store.Put(ctx, bytes.NewReader(nar), nil)
		if err != nil {
			t.Fatal(err)
		}
		if obj.NarHash != sha256.Sum256(nar) || obj.NarSize != int64(len(nar)) {
			t.Fatalf("NAR sums %x/%d do not describe the NAR", obj.NarHash, obj.NarSize)
		}
		zst := Compressed(t, nar)
		if obj.FileHash != sha256.Sum256(zst) || obj.FileSize != int64(len(zst)) || obj.Key != narstore.KeyOf(obj.FileHash) {
			t.Fatalf("file sums %+v do not describe the compressed bytes", obj)
		}
		if got := ReadNAR(t, f.Store, obj.Key); !bytes.Equal(got, nar) {
			t.Fatal("read back another NAR")
		}
		assertOnly(t, f, obj.Key)
	})

	t.Run("OpenSeeks", func(t *testing.T) {
		f := open(t)
		nar := Payload(2, 200<<10)
		obj, err := f.Store.Put(ctx, bytes.NewReader(nar), nil)
		if err != nil {
			t.Fatal(err)
		}
		zst := Compressed(t, nar)
		r, _, err := f.Store.Open(ctx, obj.Key)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		rs, ok := r.(io.ReadSeeker)
		if !ok {
			t.Fatal("Open's reader cannot seek: resumed pulls would reread the object")
		}
		head := make([]byte, 10)
		if _, err := io.ReadFull(rs, head); err != nil {
			t.Fatal(err)
		}
		off := int64(len(zst) / 2)
		if _, err := rs.Seek(off, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(rs)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(head, zst[:10]) || !bytes.Equal(rest, zst[off:]) {
			t.Fatal("seeking read the wrong bytes")
		}
		// As http.ServeContent does: the size from the end, then back.
		if end, err := rs.Seek(0, io.SeekEnd); err != nil || end != int64(len(zst)) {
			t.Fatalf("Seek(0, End) = %d, %v", end, err)
		}
		if _, err := rs.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		if all, err := io.ReadAll(rs); err != nil || !bytes.Equal(all, zst) {
			t.Fatalf("reading from the start again: %d bytes, %v", len(all), err)
		}
	})

	t.Run("VerifyRefusalLeavesNothing", func(t *testing.T) {
		f := open(t)
		refuse := errors.New("refused")
		_, err := f.Store.Put(ctx, bytes.NewReader(Payload(3, 100<<10)), func(narstore.Object) error { return refuse })
		if !errors.Is(err, refuse) {
			t.Fatalf("Put = %v, want the refusal", err)
		}
		w, err := f.Store.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(Compressed(t, Payload(4, 100<<10)))
		if _, err := w.Commit(ctx, nil, func(narstore.Object) error { return refuse }); !errors.Is(err, refuse) {
			t.Fatalf("Commit = %v, want the refusal", err)
		}
		assertOnly(t, f)
	})

	t.Run("FailingReaderLeavesNothing", func(t *testing.T) {
		f := open(t)
		broken := errors.New("connection lost")
		r := io.MultiReader(bytes.NewReader(Payload(5, 1<<20)), iotestErr{broken})
		if _, err := f.Store.Put(ctx, r, nil); !errors.Is(err, broken) {
			t.Fatalf("Put = %v, want the reader's error", err)
		}
		assertOnly(t, f)
	})

	t.Run("RelayedUploadRoundTrip", func(t *testing.T) {
		f := open(t)
		nar := Payload(6, 700<<10)
		zst := Compressed(t, nar)
		w, err := f.Store.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for chunk := range slices.Chunk(zst, 64<<10) {
			if _, err := w.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
		if w.Written() != int64(len(zst)) {
			t.Fatalf("Written = %d, wrote %d", w.Written(), len(zst))
		}
		var seen bytes.Buffer
		obj, err := w.Commit(ctx, &seen, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(seen.Bytes(), nar) || obj.FileHash != sha256.Sum256(zst) {
			t.Fatal("Commit inspected or hashed other bytes than uploaded")
		}
		if got := ReadNAR(t, f.Store, obj.Key); !bytes.Equal(got, nar) {
			t.Fatal("read back another NAR")
		}
		w.Abort() // harmless after Commit
		assertOnly(t, f, obj.Key)
	})

	t.Run("CorruptUploadRefused", func(t *testing.T) {
		f := open(t)
		w, err := f.Store.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("this is not zstd at all"))
		if _, err := w.Commit(ctx, nil, nil); !errors.Is(err, narstore.ErrCorrupt) {
			t.Fatalf("Commit = %v, want ErrCorrupt", err)
		}
		assertOnly(t, f)
	})

	t.Run("DeleteAndMissing", func(t *testing.T) {
		f := open(t)
		obj, err := f.Store.Put(ctx, bytes.NewReader(Payload(7, 10<<10)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Store.Delete(ctx, obj.Key); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.Store.Open(ctx, obj.Key); !errors.Is(err, narstore.ErrNotFound) {
			t.Fatalf("Open after Delete = %v", err)
		}
		if err := f.Store.Delete(ctx, obj.Key); !errors.Is(err, narstore.ErrNotFound) {
			t.Fatalf("second Delete = %v", err)
		}
		for _, bad := range []string{"", "../../etc/passwd", "x/y", obj.Key + "/.."} {
			if _, _, err := f.Store.Open(ctx, bad); !errors.Is(err, narstore.ErrNotFound) {
				t.Fatalf("Open(%q) = %v, want ErrNotFound", bad, err)
			}
		}
		assertOnly(t, f)
	})

	t.Run("StatAndWalk", func(t *testing.T) {
		f := open(t)
		before := time.Now().Add(-time.Minute) // store clocks may differ a little
		var objs []narstore.Object
		for i := range 3 {
			obj, err := f.Store.Put(ctx, bytes.NewReader(Payload(uint64(200+i), 20<<10)), nil)
			if err != nil {
				t.Fatal(err)
			}
			objs = append(objs, obj)
		}
		// A staged upload is not an object.
		w, _ := f.Store.Create(ctx)
		w.Write(Compressed(t, Payload(300, 1000)))
		defer w.Abort()
		for _, obj := range objs {
			info, err := f.Store.Stat(ctx, obj.Key)
			if err != nil || info.Key != obj.Key || info.Size != obj.FileSize || info.ModTime.Before(before) || info.ModTime.After(time.Now().Add(time.Minute)) {
				t.Fatalf("Stat(%s) = %+v, %v; want size %d, modified now", obj.Key, info, err, obj.FileSize)
			}
		}
		if _, err := f.Store.Stat(ctx, narstore.KeyOf([32]byte{1})); !errors.Is(err, narstore.ErrNotFound) {
			t.Fatalf("Stat of a missing key = %v", err)
		}
		if _, err := f.Store.Stat(ctx, "../x"); !errors.Is(err, narstore.ErrNotFound) {
			t.Fatalf("Stat of a malformed key = %v", err)
		}
		walked := map[string]int64{}
		if err := f.Store.Walk(ctx, func(o narstore.ObjectInfo) error { walked[o.Key] = o.Size; return nil }); err != nil {
			t.Fatal(err)
		}
		if len(walked) != len(objs) {
			t.Fatalf("Walk saw %v, want the %d objects", walked, len(objs))
		}
		for _, obj := range objs {
			if walked[obj.Key] != obj.FileSize {
				t.Fatalf("Walk saw %s as %d bytes, want %d", obj.Key, walked[obj.Key], obj.FileSize)
			}
		}
		stop := errors.New("stop")
		n := 0
		if err := f.Store.Walk(ctx, func(narstore.ObjectInfo) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
			t.Fatalf("Walk after fn's error = %v after %d calls, want that error after 1", err, n)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		f := open(t)
		// Eight writers, two of each NAR: equal content ends as one
		// object, every writer succeeds.
		var wg sync.WaitGroup
		objs := make([]narstore.Object, 8)
		errs := make([]error, 8)
		for i := range 8 {
			wg.Go(func() {
				objs[i], errs[i] = f.Store.Put(ctx, bytes.NewReader(Payload(uint64(100+i/2), 64<<10)), nil)
			})
		}
		wg.Wait()
		var want []string
		for i, err := range errs {
			if err != nil {
				t.Fatalf("writer %d: %v", i, err)
			}
			if i%2 == 0 {
				want = append(want, objs[i].Key)
				if objs[i+1].Key != objs[i].Key {
					t.Fatal("equal NARs got different keys")
				}
			}
		}
		assertOnly(t, f, want...)
		for i := 0; i < 8; i += 2 {
			if got := ReadNAR(t, f.Store, objs[i].Key); !bytes.Equal(got, Payload(uint64(100+i/2), 64<<10)) {
				t.Fatal(fmt.Sprintf("object %d reads back wrong", i))
			}
		}
	})
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }
