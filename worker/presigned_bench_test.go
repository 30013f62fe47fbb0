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
			r := newRealServer(b, openSQLite(b), server.Config{NarStore: store, NarPresign: mode.presign})
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
