package nixexec

import (
	"context"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/nix"
)

func TestUnitBytesToFree(t *testing.T) {
	const G = 1 << 30
	for _, tc := range []struct {
		name                 string
		free, minFree, maxFr uint64
		want                 uint64
	}{
		{"off", 1, 0, 0, 0},
		{"off with max-free alone", 1, 0, 10 * G, 0},
		{"enough free", 5 * G, 5 * G, 10 * G, 0},
		{"well above", 50 * G, 5 * G, 10 * G, 0},
		{"short: free up to max-free", 4 * G, 5 * G, 10 * G, 6 * G},
		{"disk full", 0, 5 * G, 10 * G, 10 * G},
		{"no max-free: every dead path", 4 * G, 5 * G, 0, math.MaxUint64},
		{"max-free not above min-free: every dead path", 4 * G, 5 * G, 5 * G, math.MaxUint64},
	} {
		if got := BytesToFree(tc.free, tc.minFree, tc.maxFr); got != tc.want {
			t.Errorf("%s: BytesToFree(%d, %d, %d) = %d, want %d", tc.name, tc.free, tc.minFree, tc.maxFr, got, tc.want)
		}
	}
}

// fakeCollector blocks each collection until proceed is closed.
type fakeCollector struct {
	mu      sync.Mutex
	calls   []uint64
	proceed chan struct{}
}

func (c *fakeCollector) CollectGarbage(ctx context.Context, maxFreed uint64) (nix.GCResult, error) {
	c.mu.Lock()
	c.calls = append(c.calls, maxFreed)
	c.mu.Unlock()
	select {
	case <-c.proceed:
	case <-ctx.Done():
		return nix.GCResult{}, ctx.Err()
	}
	return nix.GCResult{Paths: 3, BytesFreed: 4096}, nil
}

func (c *fakeCollector) called() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

func newTestGC(t *testing.T, c Collector, free, minFree, maxFree uint64, reg prometheus.Registerer) *StoreGC {
	t.Helper()
	g, err := NewStoreGC(StoreGCConfig{Store: c, Dir: t.TempDir(), MinFree: minFree, MaxFree: maxFree,
		Logger: slog.New(slog.DiscardHandler), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	g.statfs = func(string) (uint64, error) { return free, nil }
	return g
}

// A collection starts only once the open holds (a job between creating
// paths and pinning them) have closed, and no job starts while it runs;
// the job then runs to its end.
func TestUnitStoreGCWaitsForHoldsAndPausesNewJobs(t *testing.T) {
	c := &fakeCollector{proceed: make(chan struct{})}
	reg := prometheus.NewRegistry()
	g := newTestGC(t, c, 100, 1000, 5000, reg)
	h := newHarness(t)
	h.exec.GC = g
	gr := h.setupBuild()

	release, err := g.hold(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checked := make(chan nix.GCResult, 1)
	go func() { checked <- g.Check(context.Background()) }()
	waitfor.True(t, "the collection to wait for the open hold", func() bool {
		g.gate.mu.Lock()
		defer g.gate.mu.Unlock()
		return g.gate.collecting
	})
	if n := c.called(); n != 0 {
		t.Fatalf("the store was collected %d times while a job held paths it had not pinned yet", n)
	}
	release()
	waitfor.True(t, "the collection to start", func() bool { return c.called() == 1 })
	c.mu.Lock()
	got := c.calls[0]
	c.mu.Unlock()
	if got != 5000-100 {
		t.Errorf("asked to free %d bytes, want max-free minus free = %d", got, 5000-100)
	}

	ran := make(chan error, 1)
	go func() { ran <- h.run(context.Background(), buildJob(spec("b1", gr.target))) }()
	waitfor.True(t, "the new job to wait for the collection", func() bool {
		g.gate.mu.Lock()
		defer g.gate.mu.Unlock()
		return g.gate.waiters == 1
	})
	if u := h.rec.of("update"); len(u) != 0 {
		t.Fatalf("a job started during the collection: %v", h.rec.updates())
	}
	close(c.proceed)
	if res := <-checked; res.BytesFreed != 4096 || res.Paths != 3 {
		t.Errorf("Check returned %+v", res)
	}
	if err := <-ran; err != nil {
		t.Fatalf("the job held back by the collection failed: %v", err)
	}
	if got := testutil.ToFloat64(g.m.bytes); got != 4096 {
		t.Errorf("gradient_worker_store_gc_freed_bytes_total = %v, want 4096", got)
	}
	if got := testutil.ToFloat64(g.m.runs.WithLabelValues("ok")); got != 1 {
		t.Errorf("gradient_worker_store_gc_runs_total{outcome=ok} = %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "gradient_worker_store_gc_duration_seconds"); err != nil || n != 1 {
		t.Errorf("duration histogram: %d series, %v", n, err)
	}
}

// With enough free space nothing is collected; a job's end asks for a
// check.
func TestUnitStoreGCIdleAboveMinFree(t *testing.T) {
	c := &fakeCollector{proceed: make(chan struct{})}
	g := newTestGC(t, c, 2000, 1000, 5000, nil)
	if res := g.Check(context.Background()); res != (nix.GCResult{}) || c.called() != 0 {
		t.Fatalf("collected with free space above min-free: %+v, %d calls", res, c.called())
	}
	if got := testutil.ToFloat64(g.m.free); got != 2000 {
		t.Errorf("gradient_worker_store_free_bytes = %v, want 2000", got)
	}
	h := newHarness(t)
	h.exec.GC = g
	gr := h.setupBuild()
	if err := h.run(context.Background(), buildJob(spec("b1", gr.target))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.poke:
	default:
		t.Error("the job's end did not ask for a check of the free space")
	}
}

// Everything a build relies on is pinned while it builds: the .drv, the
// inputs it prefetched or already had (the GC does not keep a .drv's
// inputs' outputs), and its own outputs, before the daemon builds them.
func TestUnitBuildPinsInputsAndOutputsBeforeBuilding(t *testing.T) {
	h := newHarness(t)
	h.exec.GCRootsDir = filepath.Join(t.TempDir(), "gcroots")
	g := h.setupBuild()
	h.store.setValid(g.depOut) // built by an earlier job: not pulled
	var during []string
	h.store.build = func(ctx context.Context, drv string, opts nix.BuildOptions) (map[string]string, error) {
		entries, _ := os.ReadDir(h.exec.GCRootsDir)
		for _, e := range entries {
			target, _ := os.Readlink(filepath.Join(h.exec.GCRootsDir, e.Name()))
			during = append(during, target)
		}
		h.store.mu.Lock()
		outs := h.store.drvs[drv].OutputPaths()
		h.store.mu.Unlock()
		for _, p := range outs {
			h.store.setValid(p)
		}
		return outs, nil
	}
	if err := h.run(context.Background(), buildJob(spec("b1", g.target))); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{g.target, g.depOut, g.src1, g.out, g.outDoc} {
		if !slices.Contains(during, p) {
			t.Errorf("%s not pinned during the build; roots %v", p, during)
		}
	}
}
