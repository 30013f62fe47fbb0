package retention_test

import (
	"crypto/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// A size cap evicts whole closures: it never evicts a path that a path it
// keeps references, and a path it evicts takes along what only it
// references, however recently that was served on its own.
func TestSizeCapKeepsClosuresIntact(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		w := newWorld(t, db)
		capped, err := db.CreateCache(w.ctx, storage.NewCache{Name: "capped"})
		if err != nil {
			t.Fatal(err)
		}
		put := func(name string, refs ...string) (string, storage.CachePath) {
			t.Helper()
			p := w.path(name)
			obj, err := w.store.Put(w.ctx, strings.NewReader(strings.Repeat(rand.Text(), 100)), nil)
			if err != nil {
				t.Fatal(err)
			}
			return p, w.record(capped, p, obj, refs, false, time.Time{})
		}
		libShared, shared := put("lib-shared")
		libOld, _ := put("lib-old")
		appOld, _ := put("app-old", libOld, libShared)
		appNew, fresh := put("app-new", libShared)
		// Served: the shared library longest ago, then the old app; the
		// old app's own library after the new app (a client fetching a
		// closure asks for the references after the path).
		now := time.Now()
		served := map[string]time.Duration{libShared: -12 * time.Hour, appOld: -10 * time.Hour, appNew: -2 * time.Hour, libOld: -1 * time.Hour}
		var notes []storage.CacheServed
		for p, ago := range served {
			notes = append(notes, storage.CacheServed{CacheID: capped.ID, StoreHash: mustHash(t, p), At: now.Add(ago)})
		}
		if err := db.NoteCachePathsServed(w.ctx, notes); err != nil {
			t.Fatal(err)
		}
		max := fresh.FileSize + shared.FileSize // room for the new app's closure only
		if err := db.SetCacheMaxBytes(w.ctx, capped.ID, &max); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		c := retention.New(retention.Config{DB: db, Store: w.store, Grace: time.Millisecond})
		dry, err := c.Run(w.ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := c.Run(w.ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		want := sorted([]string{appOld, libOld})
		if got := sorted(pathsOf(rep)); !slices.Equal(got, want) {
			t.Errorf("evicted %v; want the old app with its own library %v", got, want)
		}
		if got := sorted(pathsOf(dry)); !slices.Equal(got, sorted(pathsOf(rep))) {
			t.Errorf("dry run listed %v, the run deleted %v", got, pathsOf(rep))
		}
		for _, p := range []string{appNew, libShared} {
			if !w.has(capped, p) {
				t.Errorf("%s was evicted; the kept app needs it", p)
			}
		}
		checkClosuresComplete(t, w, capped)
		w.checkNoNarinfoWithoutNar(capped)
	})
}

// checkClosuresComplete: every reference of every row of the cache has a
// row in it.
func checkClosuresComplete(t *testing.T, w *world, c storage.Cache) {
	t.Helper()
	rows, err := w.db.ListCachePaths(w.ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		for _, ref := range r.References {
			if !w.has(c, storage.StoreDir+"/"+ref) {
				t.Errorf("%s is kept without its reference %s", r.StorePath, ref)
			}
		}
	}
}
