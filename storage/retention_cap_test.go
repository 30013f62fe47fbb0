package storage

import (
	"testing"
	"time"
)

// The size cap's referenced set lives in gc_referenced. A run killed
// after filling it leaves rows behind; the next selection must not read
// them: here a stale row claims the most recently served path is
// referenced (so it would not count as a top of its own and would go),
// yet the cap keeps it and evicts the older one (docs/protocol/cache.md
// §10.1).
func TestSizeCapIgnoresAnInterruptedRunsReferencedSet(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		cache := mustCache(t, db, "capped")
		put := func(path, key string) string {
			t.Helper()
			if _, _, err := db.PutCachePath(ctx, CachePath{CacheID: cache.ID, StorePath: path,
				NarHash: "sha256:0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73", NarSize: 100,
				FileHash: "sha256:" + key, FileSize: 100, Compression: "zstd", ObjectKey: key}); err != nil {
				t.Fatal(err)
			}
			h, _ := StorePathHash(path)
			return h
		}
		older := put("/nix/store/0000000000000000000000000000aaaa-older", "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic")
		time.Sleep(5 * time.Millisecond)
		newer := put("/nix/store/0000000000000000000000000000bbbb-newer", "194qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic")
		if err := db.GCReset(ctx); err != nil {
			t.Fatal(err)
		}
		// What an interrupted run left.
		if _, err := db.exec(ctx, `INSERT INTO gc_referenced (cache_id, store_hash) VALUES ($1, $2)`, cache.ID, newer); err != nil {
			t.Fatal(err)
		}
		left, _, err := db.GCSelectOverCap(ctx, cache.ID, 150, 0)
		if err != nil {
			t.Fatal(err)
		}
		var selected []string
		if err := db.GCSelected(ctx, func(part []GCSweepEntry) error {
			for _, e := range part {
				selected = append(selected, e.StoreHash)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(selected) != 1 || selected[0] != older || left != 100 {
			t.Fatalf("selected %v leaving %d bytes; want only the older path %s, leaving 100", selected, left, older)
		}
		var stale int
		if err := db.sql.QueryRowContext(ctx, `SELECT COUNT(*) FROM gc_referenced`).Scan(&stale); err != nil || stale != 0 {
			t.Fatalf("gc_referenced keeps %d rows after the selection (%v)", stale, err)
		}
	})
}
