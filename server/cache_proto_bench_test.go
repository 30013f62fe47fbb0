package server

import (
	"path/filepath"
	"testing"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

func benchEnv(b *testing.B) *cacheProtoEnv {
	db, err := storage.Open(b.Context(), "sqlite://"+filepath.Join(b.TempDir(), "gradient.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return newCacheProtoEnv(b, db, Config{})
}

// BenchmarkNarPullOverSession streams one 16 MiB incompressible object
// over a worker session on loopback, again and again.
func BenchmarkNarPullOverSession(b *testing.B) {
	e := benchEnv(b)
	p := e.putPath(b, e.cache.ID, testStorePath("blob"), randomNar(16<<20))
	w := e.projectWorker()
	b.SetBytes(p.FileSize)
	b.ReportAllocs()
	for b.Loop() {
		send(b, w.sess, &wire.NarRequest{JobID: "j", Paths: []string{p.StorePath}})
		recvAs[*wire.NarStreamHeader](b, w.sess)
		var n int
		for {
			c := recvAs[*wire.NarPush](b, w.sess)
			n += len(c.Data)
			w.sess.Reader.Release()
			if c.IsFinal {
				break
			}
		}
		if int64(n) != p.FileSize {
			b.Fatalf("got %d of %d bytes", n, p.FileSize)
		}
	}
}

// BenchmarkNarUploadOverSession uploads a 16 MiB incompressible NAR over a
// worker session on loopback: relay, verification (decompressing it) and
// commit. Each round is a new store path, so nothing is skipped.
func BenchmarkNarUploadOverSession(b *testing.B) {
	e := benchEnv(b)
	c := compressNar(b, randomNar(16<<20))
	w := e.projectWorker()
	b.SetBytes(int64(len(c.zst)))
	b.ReportAllocs()
	var id uint64
	for b.Loop() {
		id++
		path := testStorePath("blob")
		e.produce(path) // an output of the job the session holds: uploads are scoped to it
		if _, out := uploadNar(b, w.sess, id, path, c); !isOk(out) {
			b.Fatalf("upload: %+v", out)
		}
	}
}
