package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"os"
	"strconv"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/cache"
	"gradient.dev/gradient/wire"
)

// BenchmarkUploadLarge uploads one large output (GRADIENT_BENCH_UPLOAD_MIB
// MiB of incompressible bytes, 256 by default) from the cache client to a
// real server whose NAR store is a real versitygw, side by side: by
// presigned multipart (64 MiB parts, 4 at a time, straight to the store)
// and streamed over the session (the server stages, verifies and puts it
// into the store). Each op is the whole upload up to the server's commit:
// compression, transfer, the server's verification. B/op shows the
// client's memory stays bounded (the object is spooled to disk).
//
//	GRADIENT_BENCH_UPLOAD_MIB=1024 go test -run '^$' -bench UploadLarge -benchtime 1x -count 5 ./worker/ | benchstat -col /mode -
func BenchmarkUploadLarge(b *testing.B) {
	mib := 256
	if v, err := strconv.Atoi(os.Getenv("GRADIENT_BENCH_UPLOAD_MIB")); err == nil && v > 0 {
		mib = v
	}
	nar := make([]byte, mib<<20)
	rand.Read(nar)
	for _, mode := range []struct {
		name    string
		presign cache.PresignOptions
	}{
		{"presigned-multipart", cache.PresignOptions{MultipartThreshold: 1}},
		{"streamed", cache.PresignOptions{StreamUploads: true}},
	} {
		b.Run("mode="+mode.name, func(b *testing.B) {
			store, _ := openS3(b)
			// The bare session sends no heartbeats: a slow upload must not
			// be dropped as a silent worker.
			r := newRealServer(b, openSQLite(b), server.Config{NarStore: store, NarPresign: mode.presign, HeartbeatTimeout: -1})
			client, chunks := dialCacheWorker(b, r)
			client.TempDir = b.TempDir()
			var parts int
			client.Presigned = func(op, outcome string) {
				if op == "part" && outcome == "ok" {
					parts++
				}
			}
			b.SetBytes(int64(len(nar)))
			b.ReportAllocs()
			n := uint64(0)
			for b.Loop() {
				n++
				binary.LittleEndian.PutUint64(nar, n) // a new object each time
				if err := client.Upload(context.Background(), "", randomStorePath("large"), bytes.NewReader(nar), UploadMeta{}); err != nil {
					b.Fatal(err)
				}
			}
			if presigned := mode.presign.MultipartThreshold > 0; presigned != (parts > 0) || presigned == (chunks.Load() > 0) {
				b.Fatalf("%s: %d parts, %d chunks sent", mode.name, parts, chunks.Load())
			}
		})
	}
}

// BenchmarkPresignedUploadClient is the worker's side alone of a
// presigned upload of a 64 MiB incompressible NAR to a real versitygw
// (a separate process): compression into the spool and the PUTs, single
// or multipart (5 MiB parts), no commit. B/op is the client's memory for
// the object: bounded, far below its size.
//
//	go test -run '^$' -bench PresignedUploadClient -count 5 ./worker/
func BenchmarkPresignedUploadClient(b *testing.B) {
	nar := make([]byte, 64<<20)
	rand.Read(nar)
	for _, multipart := range []bool{false, true} {
		name := "mode=put"
		if multipart {
			name = "mode=multipart"
		}
		b.Run(name, func(b *testing.B) {
			store, _ := openS3(b)
			store.MinPartSizeForTests(5 << 20)
			c := NewCacheClient(nil)
			c.TempDir = b.TempDir()
			b.SetBytes(int64(len(nar)))
			b.ReportAllocs()
			for b.Loop() {
				p, err := c.pack(context.Background(), bytes.NewReader(nar), UploadMeta{})
				if err != nil {
					b.Fatal(err)
				}
				up, err := store.PresignUpload(context.Background(), int64(len(nar))+1<<20, multipart)
				if err != nil {
					b.Fatal(err)
				}
				if multipart {
					_, err = c.uploadMultipart(context.Background(), &wire.PresignedMultipart{UploadID: up.UploadID(),
						PartSize: uint64(up.PartSize()), PartURLs: up.URLs()}, p)
				} else {
					err = c.uploadPut(context.Background(), up.URLs()[0], p)
				}
				p.close()
				up.Abort()
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
