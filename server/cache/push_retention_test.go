package cache_test

import (
	"errors"
	"testing"
	"time"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// A Push answer cached:true makes the worker skip the upload and upload
// what references the path: the answered row counts as uploaded then, so
// a collection within the grace period keeps it and its NAR
// (docs/protocol/cache.md §10.1). A row of the same age that no answer
// reused goes, so the collection did run.
func TestPushAnswerKeepsItsRowsFromACollection(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := newCacheProtoEnv(t, db, server.Config{})
		answered := e.putPath(t, e.Cache.ID, testStorePath("answered"), randomNar(1000))
		other := e.putPath(t, e.Cache.ID, testStorePath("other"), randomNar(1000))
		if err := db.AgeCachePathsForTest(ctx, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		w := e.projectWorker()
		e.produce(answered.StorePath)
		send(t, w.Sess, &wire.CacheQuery{JobID: "job", QueryID: "push", Paths: []string{answered.StorePath}, Mode: wire.QueryPush})
		if st := recvAs[*wire.CacheStatus](t, w.Sess); len(st.Cached) != 1 || !st.Cached[0].Cached {
			t.Fatalf("Push: %+v", st)
		}

		rep, err := retention.New(retention.Config{DB: db, Store: e.store, Grace: time.Hour}).Run(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if rep.PathsFreed != 1 {
			t.Errorf("freed %d paths, want 1 (the row no answer reused)", rep.PathsFreed)
		}
		for _, c := range []struct {
			p    storage.CachePath
			kept bool
		}{{answered, true}, {other, false}} {
			hash, _ := storage.StorePathHash(c.p.StorePath)
			_, rowErr := db.CachePath(ctx, e.Cache.ID, hash)
			_, objErr := e.store.Stat(ctx, c.p.ObjectKey)
			if c.kept && (rowErr != nil || objErr != nil) {
				t.Errorf("%s, answered cached to a Push, was collected: row %v, object %v", c.p.StorePath, rowErr, objErr)
			}
			if !c.kept && (!errors.Is(rowErr, storage.ErrNotFound) || objErr == nil) {
				t.Errorf("%s, unreached and old, stayed: row %v, object %v", c.p.StorePath, rowErr, objErr)
			}
		}
	})
}

// An upload of a path already stored is skipped, and the stored row is
// reused as a Push answer's is: a collection within the grace period
// keeps it (docs/protocol/cache.md §10.1). The grant reads before it
// writes; the reuse must still happen when the read finds the row.
func TestSkippedUploadKeepsItsRowFromACollection(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := newCacheProtoEnv(t, db, server.Config{})
		stored := e.putPath(t, e.Cache.ID, testStorePath("stored"), randomNar(1000))
		if err := db.AgeCachePathsForTest(ctx, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		w := e.projectWorker()
		e.produce(stored.StorePath)
		send(t, w.Sess, &wire.UploadRequest{JobID: "job", RequestID: 1, Object: &wire.UploadNar{StorePath: stored.StorePath}, Size: uint64(stored.NarSize)})
		grant, outcome := awaitGrant(t, w.Sess, 1)
		if _, skip := grant.(*wire.GrantSkip); !skip {
			t.Fatalf("upload of a stored path: grant %+v, outcome %+v; want Skip", grant, outcome)
		}
		if _, err := retention.New(retention.Config{DB: db, Store: e.store, Grace: time.Hour}).Run(ctx, false); err != nil {
			t.Fatal(err)
		}
		hash, _ := storage.StorePathHash(stored.StorePath)
		_, rowErr := db.CachePath(ctx, e.Cache.ID, hash)
		_, objErr := e.store.Stat(ctx, stored.ObjectKey)
		if rowErr != nil || objErr != nil {
			t.Errorf("%s, skipped as stored, was collected: row %v, object %v", stored.StorePath, rowErr, objErr)
		}
	})
}
