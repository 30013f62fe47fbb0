package retention_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }

type world struct {
	t     *testing.T
	ctx   context.Context
	db    *storage.DB
	store *narstore.Local
	proj  storage.Project
	cache storage.Cache
	n     int
}

func newWorld(t *testing.T, db *storage.DB) *world {
	ctx := context.Background()
	store, err := narstore.OpenLocal(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	db.SetObjectCheck(func(ctx context.Context, key string) error {
		if _, err := store.Stat(ctx, key); errors.Is(err, narstore.ErrNotFound) {
			return storage.ErrObjectMissing
		} else {
			return err
		}
	})
	team, err := db.CreateTeam(ctx, "team")
	if err != nil {
		t.Fatal(err)
	}
	proj, err := db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: "proj", Repository: "https://example.com/r.git", Branch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := db.CreateCache(ctx, storage.NewCache{Name: "main"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SubscribeProject(ctx, proj.ID, cache.ID); err != nil {
		t.Fatal(err)
	}
	return &world{t: t, ctx: ctx, db: db, store: store, proj: proj, cache: cache}
}

// path makes a store path name with a fresh hash.
func (w *world) path(name string) string {
	w.n++
	h := make([]byte, 20)
	copy(h, fmt.Sprintf("%s-%d", name, w.n))
	return storage.StoreDir + "/" + nixbase32.Encode(h) + "-" + name
}

// put stores content as an object and records path in cache with refs.
func (w *world) put(cache storage.Cache, path string, content string, refs ...string) storage.CachePath {
	w.t.Helper()
	obj, err := w.store.Put(w.ctx, strings.NewReader(content), nil)
	if err != nil {
		w.t.Fatal(err)
	}
	return w.record(cache, path, obj, refs, false, time.Time{})
}

func (w *world) record(cache storage.Cache, path string, obj narstore.Object, refs []string, pushed bool, expires time.Time) storage.CachePath {
	w.t.Helper()
	base := make([]string, len(refs))
	for i, r := range refs {
		base[i] = strings.TrimPrefix(r, storage.StoreDir+"/")
	}
	p, _, err := w.db.PutCachePath(w.ctx, storage.CachePath{CacheID: cache.ID, StorePath: path,
		NarHash: obj.NarHashText(), NarSize: obj.NarSize, FileHash: obj.FileHashText(), FileSize: obj.FileSize,
		Compression: narstore.Compression, References: base, ObjectKey: obj.Key, Pushed: pushed, ExpiresAt: expires})
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// eval records a finished evaluation whose one build has drv and outputs.
func (w *world) eval(status storage.EvaluationStatus, drv string, outputs ...string) string {
	w.t.Helper()
	e, err := jobqueue.New(w.db).CreateEvaluation(w.ctx, storage.NewEvaluation{ProjectID: w.proj.ID, RepositoryURL: "https://example.com/r.git",
		Commit: strings.Repeat("a", 40), Wildcards: []string{"packages.x86_64-linux.*"}})
	if err != nil {
		w.t.Fatal(err)
	}
	if err := w.db.AddBuildForTest(w.ctx, e.ID, drv, outputs, "succeeded"); err != nil {
		w.t.Fatal(err)
	}
	if err := w.db.FinishEvaluationForTest(w.ctx, e.ID, status); err != nil {
		w.t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // distinct created_at order
	return e.ID
}

func (w *world) has(cache storage.Cache, path string) bool {
	w.t.Helper()
	h, _ := storage.StorePathHash(path)
	_, err := w.db.CachePath(w.ctx, cache.ID, h)
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		w.t.Fatal(err)
	}
	return err == nil
}

func (w *world) hasObject(key string) bool {
	_, err := w.store.Stat(w.ctx, key)
	return err == nil
}

// checkNoNarinfoWithoutNar: every row's object exists.
func (w *world) checkNoNarinfoWithoutNar(caches ...storage.Cache) {
	w.t.Helper()
	for _, c := range caches {
		paths, err := w.db.ListCachePaths(w.ctx, c.ID)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, p := range paths {
			if !w.hasObject(p.ObjectKey) {
				w.t.Errorf("%s is recorded but its NAR object %s is gone", p.StorePath, p.ObjectKey)
			}
		}
	}
}

func TestCollectKeepsKeptEvaluationsClosures(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		w := newWorld(t, db)
		shared := w.path("glibc")
		w.put(w.cache, shared, "glibc bytes")
		var outs, drvs, deps []string
		for i := range 4 {
			dep := w.path(fmt.Sprintf("dep%d", i))
			out := w.path(fmt.Sprintf("out%d", i))
			drv := w.path(fmt.Sprintf("out%d.drv", i))
			w.put(w.cache, dep, fmt.Sprintf("dep %d", i))
			content := fmt.Sprintf("out %d", i)
			if i == 2 || i == 3 {
				content = "same bytes in two paths" // one object, two rows
			}
			w.put(w.cache, out, content, dep, shared)
			w.put(w.cache, drv, fmt.Sprintf("drv %d", i))
			outs, drvs, deps = append(outs, out), append(drvs, drv), append(deps, dep)
		}
		var evals []string
		for i := range 4 {
			evals = append(evals, w.eval(storage.EvaluationSucceeded, drvs[i], outs[i]))
		}
		// An old pinned one, kept whatever N says.
		if err := db.SetEvaluationPinned(w.ctx, evals[0], true); err != nil {
			t.Fatal(err)
		}
		two := 2
		if err := db.SetProjectKeepEvaluations(w.ctx, w.proj.ID, &two); err != nil {
			t.Fatal(err)
		}
		pushed := w.path("pushed")
		obj, _ := w.store.Put(w.ctx, strings.NewReader("pushed"), nil)
		w.record(w.cache, pushed, obj, nil, true, time.Time{})
		expired := w.path("expired")
		obj, _ = w.store.Put(w.ctx, strings.NewReader("expired"), nil)
		w.record(w.cache, expired, obj, nil, true, time.Now().Add(-time.Minute))
		orphan, _ := w.store.Put(w.ctx, strings.NewReader("orphan: an upload that never recorded its row"), nil)
		out1, _ := db.CachePath(w.ctx, w.cache.ID, mustHash(t, outs[1]))
		time.Sleep(5 * time.Millisecond)

		c := retention.New(retention.Config{DB: db, Store: w.store, Grace: time.Millisecond})
		dry, err := c.Run(w.ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		if !w.has(w.cache, outs[1]) || !w.hasObject(orphan.Key) {
			t.Fatal("the dry run deleted something")
		}
		real, err := c.Run(w.ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := pathsOf(real), pathsOf(dry); !slices.Equal(got, want) {
			t.Errorf("dry run listed %v, the run deleted %v", want, got)
		}
		if got, want := sorted(real.Objects), sorted(dry.Objects); !slices.Equal(got, want) {
			t.Errorf("dry run listed objects %v, the run deleted %v", want, got)
		}
		wantGone := []string{outs[1], drvs[1], deps[1], expired}
		if got := pathsOf(real); !slices.Equal(got, sorted(wantGone)) {
			t.Errorf("deleted %v, want %v", got, sorted(wantGone))
		}
		for _, p := range wantGone {
			if w.has(w.cache, p) {
				t.Errorf("%s survived", p)
			}
		}
		for _, p := range []string{outs[0], drvs[0], deps[0], outs[2], drvs[2], deps[2], outs[3], drvs[3], deps[3], shared, pushed} {
			if !w.has(w.cache, p) {
				t.Errorf("%s was collected although kept", p)
			}
		}
		if w.hasObject(out1.ObjectKey) {
			t.Error("the dropped output's own object survived")
		}
		if w.hasObject(orphan.Key) {
			t.Error("the orphan object survived")
		}
		if real.Protected[storage.RootEvaluation] == 0 || real.Protected[storage.RootPushed] != 1 {
			t.Errorf("protected = %v", real.Protected)
		}
		w.checkNoNarinfoWithoutNar(w.cache)
		// The next run has nothing left to do.
		again, err := c.Run(w.ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if again.PathsFreed != 0 || again.ObjectsFreed != 0 {
			t.Errorf("second run freed %d paths, %d objects", again.PathsFreed, again.ObjectsFreed)
		}
	})
}

func mustHash(t *testing.T, p string) string {
	h, err := storage.StorePathHash(p)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func pathsOf(r retention.Report) []string {
	var out []string
	for _, p := range r.Paths {
		out = append(out, p.StorePath)
	}
	return sorted(out)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// An upload of a path whose object the collection is deleting: the row
// never commits without its object.
func TestUploadRacingObjectDeletionIsNeverLost(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		w := newWorld(t, db)
		del := func(ctx context.Context, key string) error {
			err := w.store.Delete(ctx, key)
			if errors.Is(err, narstore.ErrNotFound) {
				return nil
			}
			return err
		}
		for i := range 40 {
			content := fmt.Sprintf("racing %d", i)
			path := w.path("race")
			p := w.put(w.cache, path, content)
			// The collection dropped the row and queued the object.
			if _, _, err := db.DeleteCachePath(w.ctx, w.cache.ID, mustHash(t, path)); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var uploadErr error
			wg.Go(func() {
				if _, err := db.DeleteQueuedObjects(w.ctx, nil, 10, del); err != nil {
					t.Error(err)
				}
			})
			wg.Go(func() {
				// The upload stores the object again, then records its row;
				// a collection that won in between makes it retry.
				for range 5 {
					obj, err := w.store.Put(w.ctx, strings.NewReader(content), nil)
					if err != nil {
						uploadErr = err
						return
					}
					_, _, err = db.PutCachePath(w.ctx, storage.CachePath{CacheID: w.cache.ID, StorePath: path,
						NarHash: obj.NarHashText(), NarSize: obj.NarSize, FileHash: obj.FileHashText(), FileSize: obj.FileSize,
						Compression: narstore.Compression, ObjectKey: obj.Key})
					if uploadErr = err; !errors.Is(err, storage.ErrObjectMissing) {
						return
					}
				}
			})
			wg.Wait()
			if uploadErr != nil {
				t.Fatalf("round %d: upload: %v", i, uploadErr)
			}
			if !w.hasObject(p.ObjectKey) {
				t.Fatalf("round %d: the upload committed its row but the collection deleted its NAR", i)
			}
			if _, err := db.DeleteQueuedObjects(w.ctx, nil, 10, del); err != nil {
				t.Fatal(err)
			}
			if !w.hasObject(p.ObjectKey) {
				t.Fatalf("round %d: a later deletion took the NAR of a recorded path", i)
			}
		}
	})
}

func TestSizeCapEvictsLeastRecentlyServedUnprotected(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		w := newWorld(t, db)
		capped, err := db.CreateCache(w.ctx, storage.NewCache{Name: "capped"})
		if err != nil {
			t.Fatal(err)
		}
		pushed := w.path("pushed")
		obj, _ := w.store.Put(w.ctx, strings.NewReader(strings.Repeat("p", 5000)), nil)
		w.record(capped, pushed, obj, nil, true, time.Time{})
		var paths []string
		var total int64 = obj.FileSize
		for i := range 10 {
			p := w.path(fmt.Sprintf("lru%d", i))
			row := w.put(capped, p, fmt.Sprintf("%d %s", i, strings.Repeat("x", 3000+i)))
			total += row.FileSize
			paths = append(paths, p)
		}
		// The newest half were served recently; the older half long ago.
		var served []storage.CacheServed
		for i, p := range paths {
			served = append(served, storage.CacheServed{CacheID: capped.ID, StoreHash: mustHash(t, p),
				At: time.Now().Add(time.Duration(i-20) * time.Hour)})
		}
		if err := db.NoteCachePathsServed(w.ctx, served); err != nil {
			t.Fatal(err)
		}
		max := total / 2
		if err := db.SetCacheMaxBytes(w.ctx, capped.ID, &max); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		c := retention.New(retention.Config{DB: db, Store: w.store, Grace: time.Millisecond})
		// Under the cap, a capped cache keeps what no root reaches.
		rep, err := c.Run(w.ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		sizes, err := db.CacheSizes(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sizes {
			if s.CacheID == capped.ID && s.Bytes > max {
				t.Errorf("cache holds %d bytes, cap %d", s.Bytes, max)
			}
		}
		if !w.has(capped, pushed) {
			t.Error("the pushed path was evicted")
		}
		if w.has(capped, paths[0]) || !w.has(capped, paths[9]) {
			t.Errorf("eviction did not go least recently served first: %v", pathsOf(rep))
		}
		for _, p := range rep.Paths {
			if p.Reason != "cap" {
				t.Errorf("%s deleted for %s", p.StorePath, p.Reason)
			}
		}
		w.checkNoNarinfoWithoutNar(capped)
	})
}

var _ = bytes.NewReader
