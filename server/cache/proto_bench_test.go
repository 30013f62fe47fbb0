package cache_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

func benchEnv(b *testing.B) *cacheProtoEnv {
	db, err := storage.Open(b.Context(), "sqlite://"+filepath.Join(b.TempDir(), "gradient.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return newCacheProtoEnv(b, db, server.Config{})
}

// BenchmarkNarPullOverSession streams one 16 MiB incompressible object
// over a worker session on loopback, again and again.
func BenchmarkNarPullOverSession(b *testing.B) {
	e := benchEnv(b)
	p := e.putPath(b, e.Cache.ID, testStorePath("blob"), randomNar(16<<20))
	w := e.projectWorker()
	b.SetBytes(p.FileSize)
	b.ReportAllocs()
	for b.Loop() {
		send(b, w.Sess, &wire.NarRequest{JobID: "j", Paths: []string{p.StorePath}})
		recvAs[*wire.NarStreamHeader](b, w.Sess)
		var n int
		for {
			c := recvAs[*wire.NarPush](b, w.Sess)
			n += len(c.Data)
			w.Sess.Reader.Release()
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
		if _, out := uploadNar(b, w.Sess, id, path, c); !isOk(out) {
			b.Fatalf("upload: %+v", out)
		}
	}
}

// BenchmarkSmallUploadsPipelined uploads 400-byte NARs (a .drv's size)
// through the worker's cache client as an evaluation does: 4 transfers
// at once and up to 128 sent uploads waiting for their commit. The
// server verifies and commits them concurrently.
func BenchmarkSmallUploadsPipelined(b *testing.B) {
	benchSmallUploads(b, 4, 128)
}

// BenchmarkSmallUploadsOneByOne is the same with one upload at a time,
// each waiting for its commit: the cost of one upload's round trips and
// durability.
func BenchmarkSmallUploadsOneByOne(b *testing.B) {
	benchSmallUploads(b, 1, 1)
}

func benchSmallUploads(b *testing.B, transfers, pending int) {
	e := benchEnv(b)
	w := e.projectWorker()
	client := worker.NewCacheClient(w.Sess.Send)
	go func() {
		for {
			m, err := w.Sess.Recv(context.Background())
			if err != nil {
				return
			}
			client.HandleMessage(m)
		}
	}()
	paths := make([]string, b.N)
	nars := make([][]byte, b.N)
	for i := range b.N {
		paths[i] = testStorePath(fmt.Sprintf("d%d.drv", i))
		nars[i] = append(randomNar(400), byte(i), byte(i>>8), byte(i>>16))
	}
	e.produce(paths...)
	tslots, pslots := make(chan struct{}, transfers), make(chan struct{}, pending)
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		pslots <- struct{}{}
		wg.Go(func() {
			defer func() { <-pslots }()
			tslots <- struct{}{}
			pu, err := client.StartUpload(b.Context(), "job", paths[i], bytes.NewReader(nars[i]), worker.UploadMeta{})
			<-tslots
			if err == nil {
				err = pu.Wait(b.Context())
			}
			if err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
}
