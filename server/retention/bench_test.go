package retention_test

import (
	"os"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// BenchmarkCollect runs one collection over GRADIENT_BENCH_GC_PATHS
// synthetic narinfos (default 10,000) in one cache: chains of 10 rows
// each referencing the previous one; the top of every chain in the first
// half is pushed (a root), so the first half is marked (ten generations)
// and the second half, unreachable, is deleted with its objects' queue.
// It reports the collection's time and its heap high-water mark (sampled
// every 10 ms; the rows themselves live in the database).
//
//	GRADIENT_BENCH_GC_PATHS=1000000 go test -run '^$' -bench Collect -benchtime 1x ./server/retention/
func BenchmarkCollect(b *testing.B) {
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("GRADIENT_BENCH_GC_PATHS")); err == nil && v > 0 {
		n = v
	}
	engines := []struct{ name, url string }{
		{"sqlite", storagetest.SQLiteURL(b)},
		{"postgres", storagetest.PostgresURLOrSkip(b)},
	}
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) {
			db, err := storage.Open(b.Context(), e.url)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			var peak uint64
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				cache, err := db.CreateCache(b.Context(), storage.NewCache{Name: "bench" + strconv.Itoa(i)})
				if err != nil {
					b.Fatal(err)
				}
				if err := db.BulkLoadCachePathsForTest(b.Context(), cache.ID, n, 10,
					func(i int) bool { return i < n/2 && i%10 == 9 }); err != nil {
					b.Fatal(err)
				}
				c := retention.New(retention.Config{DB: db, Grace: time.Minute})
				stop := sampleHeap(&peak)
				b.StartTimer()
				rep, err := c.Run(b.Context(), false)
				b.StopTimer()
				stop()
				if err != nil {
					b.Fatal(err)
				}
				if want := int64(n - n/2); rep.PathsFreed != want {
					b.Fatalf("freed %d paths, want %d", rep.PathsFreed, want)
				}
				if err := db.DeleteCache(b.Context(), cache.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportAllocs()
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(n), "paths")
		})
	}
}

// sampleHeap records the highest live heap seen in *peak until stop.
func sampleHeap(peak *uint64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > *peak {
				*peak = v
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
