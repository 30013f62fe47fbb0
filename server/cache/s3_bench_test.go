package cache_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
)

// BenchmarkS3NarDownload: one 16 MiB NAR fetched through the HTTP cache's
// redirect to a presigned GET, against the same object fetched straight
// from versitygw with a presigned URL (the goal is >= 0.9x).
//
//	go test -run '^$' -bench S3NarDownload -count 6 ./server | benchstat -col /via -
func BenchmarkS3NarDownload(b *testing.B) {
	srv := s3test.Start(b)
	nars, err := s3store.Open(b.Context(), s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Region: srv.Region,
		PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: b.TempDir()}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	e := newCacheEnv(b, server.Config{NarStore: nars})
	nar := randomNar(16 << 20)
	obj, err := nars.Put(b.Context(), bytes.NewReader(nar), nil)
	if err != nil {
		b.Fatal(err)
	}
	path := testStorePath("big")
	if _, _, err := e.db.PutCachePath(b.Context(), storage.CachePath{CacheID: e.cache.ID, StorePath: path,
		NarHash: obj.NarHashText(), NarSize: obj.NarSize, FileHash: obj.FileHashText(), FileSize: obj.FileSize,
		Compression: narstore.Compression, ObjectKey: obj.Key}); err != nil {
		b.Fatal(err)
	}
	direct, err := nars.PresignGet(b.Context(), obj.Key)
	if err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	fetch := func(b *testing.B, url string) {
		resp, err := client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || n != obj.FileSize {
			b.Fatalf("%d, %d bytes", resp.StatusCode, n)
		}
	}
	for _, c := range []struct{ name, url string }{
		{"via=redirect", e.url + "/cache/main/nar/" + obj.Key + ".nar.zst"},
		{"via=direct", direct},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(obj.FileSize)
			for b.Loop() {
				fetch(b, c.url)
			}
		})
	}
}
