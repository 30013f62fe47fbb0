package retention_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// joinInstance opens the database at url as a server instance of its own.
func joinInstance(t *testing.T, url, id string) (*storage.DB, *instance.Instance) {
	t.Helper()
	db, err := storage.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := instance.Join(t.Context(), instance.Config{DB: db, ID: id, Host: "test", RenewEvery: 100 * time.Millisecond, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		inst.Leave(t.Context())
		db.Close()
	})
	return db, inst
}

// Two server instances on one PostgreSQL database: a collection asked of
// both while one runs runs once; the other is refused naming the holder
// (the admin API's 409), and may run once the first has ended.
func TestCollectionRunsOnOneInstance(t *testing.T) {
	t.Parallel()
	url := storagetest.PostgresURL(t)
	dbA, instA := joinInstance(t, url, "gc-a")
	dbB, instB := joinInstance(t, url, "gc-b")
	w := newWorld(t, dbA)
	var garbage []string
	for i := range 3 {
		p := w.path("junk")
		w.put(w.cache, p, strings.Repeat("x", 10+i))
		garbage = append(garbage, p)
	}
	pause := filepath.Join(t.TempDir(), "pause")
	a := retention.New(retention.Config{DB: dbA, Store: w.store, Instances: instA, PauseFile: pause})
	b := retention.New(retention.Config{DB: dbB, Store: w.store, Instances: instB})

	type result struct {
		rep retention.Report
		err error
	}
	doneA := make(chan result, 1)
	go func() {
		rep, err := a.Run(t.Context(), false)
		doneA <- result{rep, err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(pause); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("instance A's collection never reached its pause")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A is mid-sweep: B's run, dry or not, is refused and runs nothing.
	for _, dry := range []bool{false, true} {
		rep, err := b.Run(t.Context(), dry)
		if !errors.Is(err, storage.ErrConflict) || !strings.Contains(err.Error(), "gc-a") {
			t.Fatalf("B's collection while A's runs (dry %v): %v", dry, err)
		}
		if rep.PathsFreed != 0 || rep.ObjectsFreed != 0 {
			t.Fatalf("B's refused collection freed %+v", rep)
		}
	}
	// Held past several of B's lease periods: A renews its lease.
	time.Sleep(1500 * time.Millisecond)
	if _, err := b.Run(t.Context(), true); !errors.Is(err, storage.ErrConflict) {
		t.Fatalf("A's lease lapsed while it ran: %v", err)
	}
	if err := os.Remove(pause); err != nil {
		t.Fatal(err)
	}
	res := <-doneA
	if res.err != nil || res.rep.PathsFreed != int64(len(garbage)) {
		t.Fatalf("A's collection: %+v, %v", res.rep, res.err)
	}
	for _, p := range garbage {
		if w.has(w.cache, p) {
			t.Fatalf("%s survived", p)
		}
	}
	// A's run is over: B may run now, and finds nothing left.
	rep, err := b.Run(t.Context(), false)
	if err != nil || rep.PathsFreed != 0 {
		t.Fatalf("B's later collection: %+v, %v", rep, err)
	}
}

// runStarts records when collections start: a run first flushes the
// cache's served times (Content.FlushServed).
type runStarts struct {
	mu     sync.Mutex
	starts []time.Time
}

func (r *runStarts) ForgetNarinfos() {}

func (r *runStarts) FlushServed(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, time.Now())
	return nil
}

// Two instances' periodic collections: together one per interval, never
// two within one.
func TestPeriodicCollectionOncePerInterval(t *testing.T) {
	t.Parallel()
	url := storagetest.PostgresURL(t)
	const interval = 500 * time.Millisecond
	starts := &runStarts{}
	var collectors []*retention.Collector
	for _, id := range []string{"p-a", "p-b"} {
		db, inst := joinInstance(t, url, id)
		collectors = append(collectors, retention.New(retention.Config{DB: db, Instances: inst, Interval: interval,
			Content: starts, FlushEvery: time.Hour}))
	}
	ctx, cancel := context.WithCancel(t.Context())
	for _, c := range collectors {
		c.Start(ctx)
	}
	time.Sleep(10 * interval)
	cancel()
	starts.mu.Lock()
	defer starts.mu.Unlock()
	list := slices.Clone(starts.starts)
	slices.SortFunc(list, func(a, b time.Time) int { return a.Compare(b) })
	if len(list) < 2 {
		t.Fatalf("%d collections in %s", len(list), 10*interval)
	}
	// The periodic lease lasts 9/10 of the interval from when a run took
	// it; the rest is room for the time between taking it and starting.
	for i := 1; i < len(list); i++ {
		if gap := list[i].Sub(list[i-1]); gap < interval*7/10 {
			t.Fatalf("collections %d and %d started %s apart, within one %s interval", i-1, i, gap, interval)
		}
	}
	t.Logf("%d collections in %s at a %s interval", len(list), 10*interval, interval)
}
