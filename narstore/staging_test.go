package narstore

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
)

// Both kinds of staging file store, replace or keep an existing object,
// and leave nothing behind when aborted; an unnamed one is never seen in
// the store directory while its upload is open.
func TestStagingFiles(t *testing.T) {
	for _, unnamed := range []bool{true, false} {
		name := map[bool]string{true: "unnamed", false: "named"}[unnamed]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			if unnamed && !s.unnamed {
				t.Skip("the test directory's filesystem has no O_TMPFILE")
			}
			s.unnamed = unnamed
			nar := payload(3000)
			var zst bytes.Buffer
			if _, err := Compress(context.Background(), &zst, bytes.NewReader(nar)); err != nil {
				t.Fatal(err)
			}
			temps := func() []string {
				names, _ := filepath.Glob(filepath.Join(dir, "nars", tempPattern))
				return names
			}

			u, err := s.Create(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := u.Write(zst.Bytes()); err != nil {
				t.Fatal(err)
			}
			if got := temps(); unnamed && len(got) != 0 || !unnamed && len(got) != 1 {
				t.Fatalf("open upload: temporary files %v", got)
			}
			obj, err := u.Commit(t.Context(), nil, nil)
			if err != nil || !bytes.Equal(readObject(t, s, obj.Key), nar) {
				t.Fatalf("commit: %+v, %v", obj, err)
			}
			// The same object again, over the stored one, by both paths.
			u, _ = s.Create(t.Context())
			u.Write(zst.Bytes())
			if again, err := u.Commit(t.Context(), nil, nil); err != nil || again != obj {
				t.Fatalf("second commit: %+v, %v", again, err)
			}
			if again, err := s.Put(t.Context(), bytes.NewReader(nar), nil); err != nil || again != obj {
				t.Fatalf("put of the stored object: %+v, %v", again, err)
			}
			if !bytes.Equal(readObject(t, s, obj.Key), nar) {
				t.Fatal("the stored object changed")
			}
			u, _ = s.Create(t.Context())
			u.Write(zst.Bytes()[:100])
			u.Abort()
			if keys, _ := s.Keys(); len(keys) != 1 || keys[0] != obj.Key || len(temps()) != 0 {
				t.Fatalf("after an abort: objects %v, temporary files %v", keys, temps())
			}
		})
	}
}
