package nixexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/nix"
)

// Keeping the worker's Nix store within bounds (docs/protocol/worker.md
// §7.8): when free space on the store's file system falls below MinFree,
// a garbage collection through the daemon deletes dead paths until
// MaxFree is free, in the spirit of Nix's min-free and max-free.
//
// What a running job needs is never dead: every path a job pulls, fetches,
// instantiates or builds is pinned (gcroots.go) before the job relies on
// it. The windows where a job has paths in the store that no link pins
// yet — a fetch or an evaluation by the Nix CLI until its results are
// pinned, a pin and the validity check after it — are "holds" on the
// collector's gate: a collection starts only when no hold is open, and
// while it runs no hold opens and no new job starts. Running jobs go on
// meanwhile, held by their links and by the daemon's temporary roots on
// the connections they are using.

// Collector is what StoreGC needs of the store; *nix.Nix implements it.
type Collector interface {
	CollectGarbage(ctx context.Context, maxFreed uint64) (nix.GCResult, error)
}

var _ Collector = (*nix.Nix)(nil)

// StoreGCConfig configures NewStoreGC.
type StoreGCConfig struct {
	Store Collector
	// Dir is a directory on the store's file system: the real store
	// directory (nix.Nix.RealStoreDir).
	Dir string
	// MinFree: below this many free bytes a collection runs (0: never).
	// MaxFree: a collection frees until this many are free (0, or not
	// above MinFree: every dead path).
	MinFree, MaxFree uint64
	// Interval between checks of the free space (0: one minute); a job's
	// end checks too.
	Interval time.Duration
	Logger   *slog.Logger
	// Metrics receives the collector's series (nil: none).
	Metrics prometheus.Registerer
}

// StoreGC is the store's collector. Set it as Executor.GC and call Run.
type StoreGC struct {
	cfg  StoreGCConfig
	log  *slog.Logger
	m    *gcMetrics
	gate gate
	poke chan struct{}
	// statfs reads the free bytes of dir; tests of the loop replace it.
	statfs func(dir string) (uint64, error)
}

// NewStoreGC returns the collector; its series are registered now.
func NewStoreGC(cfg StoreGCConfig) (*StoreGC, error) {
	if cfg.Store == nil || cfg.Dir == "" {
		return nil, errors.New("store gc: a store and its directory are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	g := &StoreGC{cfg: cfg, log: cfg.Logger, poke: make(chan struct{}, 1), statfs: FreeBytes}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.gate.init()
	m, err := newGCMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	g.m = m
	return g, nil
}

// BytesToFree is the decision: with free bytes free, how many a
// collection should free — 0 while free is at least minFree (or minFree
// is 0, off), up to maxFree otherwise; math.MaxUint64 (every dead path)
// when maxFree is 0 or not above minFree.
func BytesToFree(free, minFree, maxFree uint64) uint64 {
	if minFree == 0 || free >= minFree {
		return 0
	}
	if maxFree <= minFree {
		return math.MaxUint64
	}
	return maxFree - free
}

// FreeBytes is the space unprivileged users may still use on dir's file
// system (what Nix's min-free compares).
func FreeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	size := uint64(st.Frsize)
	if size == 0 {
		size = uint64(st.Bsize)
	}
	return st.Bavail * size, nil
}

// Run checks the free space every Interval and after each job, and
// collects when it is short, until ctx ends.
func (g *StoreGC) Run(ctx context.Context) {
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		g.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-g.poke:
		}
	}
}

// jobEnded asks Run for a check (a job's end may have filled the disk).
func (g *StoreGC) jobEnded() {
	if g == nil {
		return
	}
	select {
	case g.poke <- struct{}{}:
	default:
	}
}

// Check collects once if free space is below MinFree; it returns what was
// collected (zero when nothing ran).
func (g *StoreGC) Check(ctx context.Context) nix.GCResult {
	free, err := g.statfs(g.cfg.Dir)
	if err != nil {
		g.log.Warn("store gc: cannot read free space", "dir", g.cfg.Dir, "error", err)
		return nix.GCResult{}
	}
	g.m.free.Set(float64(free))
	want := BytesToFree(free, g.cfg.MinFree, g.cfg.MaxFree)
	if want == 0 {
		return nix.GCResult{}
	}
	g.log.Info("store gc: free space low; collecting garbage", "dir", g.cfg.Dir, "free_bytes", free,
		"min_free", g.cfg.MinFree, "max_free", g.cfg.MaxFree)
	waitStart := time.Now()
	if err := g.gate.close(ctx); err != nil {
		return nix.GCResult{}
	}
	waited := time.Since(waitStart)
	start := time.Now()
	res, err := g.cfg.Store.CollectGarbage(ctx, want)
	took := time.Since(start)
	g.gate.open()
	after, ferr := g.statfs(g.cfg.Dir)
	if ferr == nil {
		g.m.free.Set(float64(after))
	}
	outcome := "ok"
	if err != nil {
		outcome = "failed"
	}
	g.m.runs.WithLabelValues(outcome).Inc()
	g.m.duration.Observe(took.Seconds())
	g.m.bytes.Add(float64(res.BytesFreed))
	g.m.paths.Add(float64(res.Paths))
	attrs := []any{"dir", g.cfg.Dir, "freed_bytes", res.BytesFreed, "paths", res.Paths, "duration", took.Round(time.Millisecond),
		"waited_for_jobs", waited.Round(time.Millisecond), "free_before", free, "free_after", after}
	if err != nil {
		g.log.Warn("store gc: collection failed", append(attrs, "error", err)...)
		return res
	}
	g.log.Info("store gc: collected garbage", attrs...)
	if ferr == nil && after < g.cfg.MinFree {
		g.log.Warn("store gc: still below min-free after collecting every dead path it could; the store's live paths fill the disk",
			"free_bytes", after, "min_free", g.cfg.MinFree)
	}
	return res
}

// hold opens a window in which the caller may have unpinned paths in the
// store; release closes it. It waits while a collection runs. Nil-safe.
func (g *StoreGC) hold(ctx context.Context) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	return g.gate.hold(ctx)
}

// gate lets holds run together and a collection only alone (a
// readers-writer lock whose waits end with their context). A waiting
// collection stops new holds, so a stream of jobs cannot starve it.
type gate struct {
	mu         sync.Mutex
	holders    int
	collecting bool
	waiters    int // holds waiting for a collection's end (for tests)
	// changed is closed (and replaced) whenever holders reaches 0 or a
	// collection ends.
	changed chan struct{}
}

func (g *gate) init() { g.changed = make(chan struct{}) }

func (g *gate) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}

func (g *gate) hold(ctx context.Context) (func(), error) {
	g.mu.Lock()
	for g.collecting {
		ch := g.changed
		g.waiters++
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			g.mu.Lock()
			g.waiters--
			g.mu.Unlock()
			return nil, ctx.Err()
		}
		g.mu.Lock()
		g.waiters--
	}
	g.holders++
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			if g.holders--; g.holders == 0 {
				g.signal()
			}
			g.mu.Unlock()
		})
	}, nil
}

// close waits for the open holds to end, keeping new ones out.
func (g *gate) close(ctx context.Context) error {
	g.mu.Lock()
	g.collecting = true
	for g.holders > 0 {
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			g.open()
			return ctx.Err()
		}
		g.mu.Lock()
	}
	g.mu.Unlock()
	return nil
}

func (g *gate) open() {
	g.mu.Lock()
	g.collecting = false
	g.signal()
	g.mu.Unlock()
}

// gcMetrics are the collector's series.
type gcMetrics struct {
	runs     *prometheus.CounterVec
	bytes    prometheus.Counter
	paths    prometheus.Counter
	duration prometheus.Histogram
	free     prometheus.Gauge
}

// gcBuckets span a collection of a few paths to one of a large store on
// a slow disk.
var gcBuckets = []float64{.1, .5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600}

func newGCMetrics(r prometheus.Registerer) (*gcMetrics, error) {
	m := &gcMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_worker_store_gc_runs_total", Help: "Garbage collections of the worker's Nix store, by outcome (ok, failed).",
		}, []string{"outcome"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_worker_store_gc_freed_bytes_total", Help: "Bytes the store's garbage collections freed.",
		}),
		paths: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_worker_store_gc_deleted_paths_total", Help: "Store paths the garbage collections deleted.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gradient_worker_store_gc_duration_seconds", Help: "Time one garbage collection of the store took (not counting the wait for jobs' holds).",
			Buckets: gcBuckets,
		}),
		free: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gradient_worker_store_free_bytes", Help: "Free bytes on the store's file system at the last check.",
		}),
	}
	if r != nil {
		for _, c := range []prometheus.Collector{m.runs, m.bytes, m.paths, m.duration, m.free} {
			if err := r.Register(c); err != nil {
				return nil, fmt.Errorf("store gc metrics: %w", err)
			}
		}
	}
	return m, nil
}
