package storage

import (
	"context"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
)

// waitingOnLock reports whether a statement starting with prefix waits
// for a lock in db's database.
func waitingOnLock(ctx context.Context, t *testing.T, db *DB, prefix string) bool {
	var n int
	if err := db.sql.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND ltrim(query) LIKE $1`,
		prefix+"%").Scan(&n); err != nil {
		t.Error(err)
		return true
	}
	return n > 0
}

// The same race for a Push answer (docs/protocol/cache.md §10.1): a
// worker told a path is cached skips its upload, so the row it was
// answered from must stay, or the answer must say uncached. The row is
// old (outside the grace period) and a collection already selected it;
// ReuseCachePaths and the collection's delete meet, in each order.
func TestCollectionAndPushAnswerNeverLoseARow(t *testing.T) {
	t.Parallel()
	for _, order := range []string{"reuse first", "delete first"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			forEachEngine(t, func(t *testing.T, db *DB) {
				ctx := t.Context()
				cache := mustCache(t, db, "main")
				const out = "/nix/store/0000000000000000000000000000aaaa-a"
				hash, _ := StorePathHash(out)
				if _, _, err := db.PutCachePath(ctx, CachePath{CacheID: cache.ID, StorePath: out,
					NarHash: "sha256:0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73", NarSize: 1,
					FileHash: "sha256:094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic", FileSize: 1,
					Compression: "zstd", ObjectKey: "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic"}); err != nil {
					t.Fatal(err)
				}
				if err := db.AgeCachePathsForTest(ctx, 2*time.Hour); err != nil {
					t.Fatal(err)
				}
				// The collection's mark and selection, before the answer.
				if err := db.GCReset(ctx); err != nil {
					t.Fatal(err)
				}
				cutoff := time.Now().Add(-time.Hour) // a grace period of an hour
				if err := db.GCMarkRecent(ctx, 0, cutoff); err != nil {
					t.Fatal(err)
				}
				if err := db.GCSelectUnreachable(ctx, cutoff); err != nil {
					t.Fatal(err)
				}
				remarked := time.Now()

				firstIn, release := make(chan struct{}), make(chan struct{})
				var once sync.Once
				hold := func() {
					once.Do(func() {
						close(firstIn)
						<-release
					})
				}
				hooks := &GCHooks{}
				if order == "reuse first" {
					hooks.ReuseTouched = hold
				} else {
					hooks.DeleteBatchDeleted = hold
				}
				db.SetGCHooksForTest(hooks)

				var wg sync.WaitGroup
				var reuseErr, delErr error
				var deleted []GCSweepEntry
				var answered []CachePath
				reuse := func() {
					defer wg.Done()
					answered, reuseErr = db.ReuseCachePaths(ctx, []string{cache.ID}, []string{hash})
				}
				del := func() {
					defer wg.Done()
					deleted, _, delErr = db.GCDeleteSelected(ctx, cutoff, time.Now(), remarked)
				}
				first, second, secondSQL := reuse, del, "DELETE FROM cache_paths"
				if order == "delete first" {
					first, second, secondSQL = del, reuse, "UPDATE cache_paths"
				}
				wg.Add(2)
				firstDone := make(chan struct{})
				go func() { first(); close(firstDone) }()
				select {
				case <-firstIn:
				case <-firstDone:
					t.Fatalf("the first transaction ended before its hook: reuse %v, delete %v", reuseErr, delErr)
				}
				go second()
				if db.engine == EnginePostgres {
					waitfor.True(t, "the second transaction waits for the first one's row lock", func() bool {
						return waitingOnLock(ctx, t, db, secondSQL)
					})
				}
				close(release)
				wg.Wait()
				if reuseErr != nil || delErr != nil {
					t.Fatalf("reuse: %v, delete: %v", reuseErr, delErr)
				}

				_, rowErr := db.CachePath(ctx, cache.ID, hash)
				switch order {
				case "reuse first":
					if len(answered) != 1 {
						t.Fatalf("the Push answer found %d rows, want 1", len(answered))
					}
					if rowErr != nil || len(deleted) != 0 {
						t.Fatalf("the row a Push answer reused was deleted (%v, deleted %d)", rowErr, len(deleted))
					}
				case "delete first":
					if rowErr == nil || len(deleted) != 1 {
						t.Fatalf("the row was not deleted (deleted %d)", len(deleted))
					}
					if len(answered) != 0 {
						t.Fatalf("the Push answer reused a row the collection deleted: %+v", answered)
					}
				}
			})
		})
	}
}
