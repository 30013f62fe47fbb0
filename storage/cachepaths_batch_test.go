package storage

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
)

// Narinfo rows of concurrent commits go in one transaction; a row that
// fails (its cache was deleted) fails only its own PutCachePath, and the
// others of its batch are stored, each told whether it created its row.
func TestPutCachePathBatchFailureReachesOnlyItsCaller(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		c, err := db.CreateCache(ctx, NewCache{Name: "main"})
		if err != nil {
			t.Fatal(err)
		}
		gone, err := db.CreateCache(ctx, NewCache{Name: "gone"})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteCache(ctx, gone.ID); err != nil {
			t.Fatal(err)
		}
		// Stored before: its put in the batch finds it (created false).
		if _, created, err := db.PutCachePath(ctx, batchTestPath(c.ID, 1)); err != nil || !created {
			t.Fatalf("first put: created %v, %v", created, err)
		}

		// Call 0 holds the batcher's lane until every other call waits,
		// so calls 1..n-1 form one batch.
		b := db.cachePaths
		release := make(chan struct{})
		inner := b.Run
		var mu sync.Mutex
		var sizes []int
		b.Run = func(ctx context.Context, puts []cachePathPut) ([]cachePathPut, error) {
			if len(puts) == 1 && puts[0].row.StorePath == batchTestPath(c.ID, 0).StorePath {
				<-release
			}
			mu.Lock()
			sizes = append(sizes, len(puts))
			mu.Unlock()
			return inner(ctx, puts)
		}
		const n, bad = 8, 5
		type result struct {
			created bool
			err     error
		}
		results := make([]result, n)
		put := func(i int) {
			p := batchTestPath(c.ID, i)
			if i == bad {
				p = batchTestPath(gone.ID, i)
			}
			if i == 7 {
				p = batchTestPath(c.ID, 1) // the row stored before
				p.NarSize = 999
			}
			_, created, err := db.PutCachePath(ctx, p)
			results[i] = result{created, err}
		}
		var wg sync.WaitGroup
		wg.Go(func() { put(0) })
		for b.Running() == 0 {
			runtime.Gosched()
		}
		for i := 1; i < n; i++ {
			wg.Go(func() { put(i) })
		}
		for b.Waiting() < n-1 {
			runtime.Gosched()
		}
		close(release)
		wg.Wait()

		t.Logf("batch sizes %v", sizes)
		if !slices.Contains(sizes, n-1) {
			t.Fatalf("batch sizes %v: the waiting calls did not go together", sizes)
		}
		for i, r := range results {
			switch {
			case i == bad:
				if !errors.Is(r.err, ErrNotFound) {
					t.Errorf("put %d into the deleted cache: %v, want ErrNotFound", i, r.err)
				}
			case i == 1 || i == 7:
				if r.err != nil || r.created {
					t.Errorf("put %d of the stored path: created %v, %v; want the stored row", i, r.created, r.err)
				}
			default:
				if r.err != nil || !r.created {
					t.Errorf("put %d: created %v, %v", i, r.created, r.err)
				}
			}
		}
		for i := range n {
			p := batchTestPath(c.ID, i)
			hash := p.StorePath[len(StoreDir)+1:][:StoreHashLen]
			got, err := db.CachePath(ctx, c.ID, hash)
			switch {
			case i == bad:
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("path %d stored in main: %+v, %v", i, got, err)
				}
			case i == 7:
			case err != nil || got.FileSize != p.FileSize || got.NarSize != 120:
				t.Errorf("path %d: %+v, %v", i, got, err)
			}
		}
	})
}
