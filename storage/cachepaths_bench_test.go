package storage

import (
	"fmt"
	"sync"
	"testing"
)

// BenchmarkPutCachePathConcurrent records narinfo rows as the commits of
// an evaluation's uploads do: 32 at once, on SQLite.
func BenchmarkPutCachePathConcurrent(b *testing.B) { benchPutCachePath(b, 32) }

// BenchmarkPutCachePathOneByOne records them one after another: what a
// row costs when no other commit shares its transaction.
func BenchmarkPutCachePathOneByOne(b *testing.B) { benchPutCachePath(b, 1) }

func benchPutCachePath(b *testing.B, workers int) {
	db, err := Open(b.Context(), freshSQLiteURL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	c, err := db.CreateCache(b.Context(), NewCache{Name: "main"})
	if err != nil {
		b.Fatal(err)
	}
	paths := make([]CachePath, b.N)
	for i := range paths {
		paths[i] = batchTestPath(c.ID, i)
	}
	next := make(chan int)
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for range workers {
		wg.Go(func() {
			for i := range next {
				if _, _, err := db.PutCachePath(b.Context(), paths[i]); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range b.N {
		next <- i
	}
	close(next)
	wg.Wait()
}

// batchTestPath is the i-th of distinct rows of a cache.
func batchTestPath(cacheID string, i int) CachePath {
	return CachePath{
		CacheID: cacheID, StorePath: fmt.Sprintf("/nix/store/%032d-p%d", i, i),
		NarHash: "sha256:0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73", NarSize: 120,
		FileHash: "sha256:094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic", FileSize: 80 + int64(i),
		Compression: "zstd", ObjectKey: "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic",
	}
}
