// Package retention collects the binary cache's garbage: it keeps what
// kept evaluations, pinned evaluations, operators' pushes and recent
// uploads reach (their whole closure), deletes the rest — and, in a cache
// with a size cap, the least recently served unprotected paths above the
// cap — then the NAR objects no row of any cache references, and the job
// logs of evaluations no longer kept. It talks to the database through
// storage and to the objects only through narstore.Store, so any NAR
// store collects the same way. docs/protocol/cache.md §10.1 has the rules
// that keep it crash-safe and conservative.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/server/adminapi"
	"gradient.dev/gradient/storage"
)

// DefaultKeep is how many of a project's newest evaluations are kept
// unless the project says otherwise (the reference's eval.maxKeep).
const DefaultKeep = 30

// DefaultGrace spares recent uploads; DefaultInterval is the period of
// automatic runs.
const (
	DefaultGrace    = 6 * time.Hour
	DefaultInterval = 24 * time.Hour
)

// listMax bounds the paths and objects a report names (the rest is
// counted, never held): a run's memory does not grow with what it frees.
const listMax = 1000

// Content is what the binary cache does for a collection.
type Content interface {
	// ForgetNarinfos drops every remembered narinfo (rows were deleted).
	ForgetNarinfos()
	// FlushServed writes when paths were last served to the database.
	FlushServed(ctx context.Context) error
}

// Config configures a Collector.
type Config struct {
	DB    *storage.DB
	Store narstore.Store // nil: rows only, no objects
	// Content may be nil (tests without a cache).
	Content     Content
	Interval    time.Duration // automatic runs; 0: only on demand
	Grace       time.Duration // nothing uploaded this recently is collected
	DefaultKeep int           // evaluations kept per project without a setting
	// FlushEvery is the period of FlushServed (default a minute).
	FlushEvery time.Duration
	Logger     *slog.Logger
	Metrics    prometheus.Registerer
	// PauseFile, if set, is a test hook: after the first batch of rows is
	// deleted the run creates the file and waits until it is removed.
	PauseFile string
	// Instances makes collections run on one server instance at a time
	// when several share the database; nil: this is the only one.
	Instances Instances
}

// Instances is what a collection asks of the server instances
// (server/instance.Instance).
type Instances interface {
	// RunExclusive runs fn unless another instance runs name, which is
	// an error of kind storage.ErrConflict naming that instance.
	RunExclusive(ctx context.Context, name string, fn func(ctx context.Context) error) error
	// TakeFor reports whether this instance takes name for d.
	TakeFor(ctx context.Context, name string, d time.Duration) (bool, error)
}

// Lease names (server/instance): gcLease is held while a collection runs
// on some instance; gcPeriodicLease spends one automatic run's interval,
// so the instances' timers together run one collection per Interval.
const (
	gcLease         = "gc"
	gcPeriodicLease = "gc:periodic"
)

// Collector runs collections, one at a time.
type Collector struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	mu      sync.Mutex // one run at a time (the work tables are shared)
}

// New builds a collector; it registers its series on cfg.Metrics.
func New(cfg Config) *Collector {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DefaultKeep <= 0 {
		cfg.DefaultKeep = DefaultKeep
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = time.Minute
	}
	if cfg.Grace < 0 {
		cfg.Grace = 0
	}
	c := &Collector{cfg: cfg, log: cfg.Logger, metrics: newMetrics()}
	if cfg.Metrics != nil {
		c.metrics.register(cfg.Metrics)
	}
	return c
}

// Report is what a run freed, or would free: the admin API's answer.
type Report = adminapi.GCReport

func addPath(r *Report, e storage.GCSweepEntry) {
	r.PathsFreed++
	if len(r.Paths) < listMax {
		r.Paths = append(r.Paths, adminapi.GCPath{CacheID: e.CacheID, StorePath: e.StorePath, FileSize: e.FileSize, Reason: e.Reason})
	} else {
		r.Truncated = true
	}
}

func addObject(r *Report, key string, size int64) {
	r.ObjectsFreed++
	r.BytesFreed += size
	if len(r.Objects) < listMax {
		r.Objects = append(r.Objects, key)
	} else {
		r.Truncated = true
	}
}

// Start runs collections every Interval (if set) and flushes when paths
// were served every FlushEvery, until ctx ends.
func (c *Collector) Start(ctx context.Context) {
	go func() {
		flush := time.NewTicker(c.cfg.FlushEvery)
		defer flush.Stop()
		var gc <-chan time.Time
		if c.cfg.Interval > 0 {
			t := time.NewTicker(c.cfg.Interval)
			defer t.Stop()
			gc = t.C
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-flush.C:
				if c.cfg.Content != nil {
					if err := c.cfg.Content.FlushServed(ctx); err != nil && ctx.Err() == nil {
						c.log.Warn("retention: recording served paths failed", "error", err)
					}
				}
			case <-gc:
				if c.cfg.Instances != nil {
					took, err := c.cfg.Instances.TakeFor(ctx, gcPeriodicLease, c.cfg.Interval*9/10)
					if err != nil || !took {
						if err != nil && ctx.Err() == nil {
							c.log.Warn("retention: taking the periodic collection's lease failed", "error", err)
						}
						continue // another instance runs this interval's collection
					}
				}
				_, err := c.Run(ctx, false)
				switch {
				case errors.Is(err, storage.ErrConflict):
					c.log.Info("retention: periodic collection skipped", "reason", err)
				case err != nil && ctx.Err() == nil:
					c.log.Error("retention: collection failed", "error", err)
				}
			}
		}
	}()
}

// Run collects once; dry lists what a run would delete and deletes
// nothing. A run that fails or is killed leaves nothing inconsistent: the
// next run finishes it. Runs on this instance wait for each other; one
// asked while another server instance collects is refused with an error
// of kind storage.ErrConflict naming that instance (the work tables are
// shared), and does not run.
func (c *Collector) Run(ctx context.Context, dry bool) (rep Report, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg.Instances == nil {
		return c.run(ctx, dry)
	}
	err = c.cfg.Instances.RunExclusive(ctx, gcLease, func(ctx context.Context) error {
		rep, err = c.run(ctx, dry)
		return err
	})
	return rep, err
}

func (c *Collector) run(ctx context.Context, dry bool) (rep Report, err error) {
	start := time.Now()
	rep = Report{DryRun: dry, Paths: []adminapi.GCPath{}, Objects: []string{}}
	defer func() {
		rep.Duration = time.Since(start)
		c.record(&rep, err)
	}()
	db := c.cfg.DB
	if c.cfg.Content != nil {
		if err := c.cfg.Content.FlushServed(ctx); err != nil {
			return rep, fmt.Errorf("record served paths: %w", err)
		}
	}
	if !dry {
		// A run that was interrupted left objects queued.
		if err := c.deleteQueued(ctx, &rep); err != nil {
			return rep, err
		}
	}
	if err := db.GCReset(ctx); err != nil {
		return rep, fmt.Errorf("reset: %w", err)
	}
	if err := db.GCAnalyze(ctx); err != nil {
		return rep, fmt.Errorf("statistics: %w", err)
	}
	markStart := time.Now()
	cutoff := markStart.Add(-c.cfg.Grace)
	kept, err := db.KeptEvaluations(ctx, c.cfg.DefaultKeep)
	if err != nil {
		return rep, fmt.Errorf("kept evaluations: %w", err)
	}
	keptSet := map[string]bool{}
	for _, ids := range kept {
		for _, id := range ids {
			keptSet[id] = true
			if err := db.GCRootEvaluation(ctx, id); err != nil {
				return rep, fmt.Errorf("roots of evaluation %s: %w", id, err)
			}
		}
	}
	gen := 0
	if err := db.GCMarkRoots(ctx, gen, markStart); err != nil {
		return rep, fmt.Errorf("mark roots: %w", err)
	}
	if gen, err = c.propagate(ctx, gen); err != nil {
		return rep, err
	}
	// Recent uploads last: what kept evaluations and pushes reach keeps
	// their kind, which the size cap respects.
	gen++
	if err := db.GCMarkRecent(ctx, gen, cutoff); err != nil {
		return rep, fmt.Errorf("mark recent: %w", err)
	}
	if gen, err = c.propagate(ctx, gen); err != nil {
		return rep, err
	}
	if err := db.GCSelectUnreachable(ctx, cutoff); err != nil {
		return rep, fmt.Errorf("select unreachable: %w", err)
	}
	if err := db.GCAnalyze(ctx); err != nil { // gc_marks and gc_sweep were filled
		return rep, fmt.Errorf("statistics: %w", err)
	}
	sizes, err := db.CacheSizes(ctx)
	if err != nil {
		return rep, err
	}
	for _, s := range sizes {
		if s.MaxBytes == nil {
			continue
		}
		var left int64
		left, gen, err = db.GCSelectOverCap(ctx, s.CacheID, *s.MaxBytes, gen)
		if err != nil {
			return rep, fmt.Errorf("select over cap of %s: %w", s.Name, err)
		}
		if left > *s.MaxBytes {
			c.log.Warn("retention: cache stays above its size cap: what is left is protected",
				"cache", s.Name, "bytes", left, "max_bytes", *s.MaxBytes)
		}
	}
	// Evaluations that began or ended while this run marked keep what
	// they use: mark them before anything goes. A row touched since the
	// latest re-mark began is not deleted (GCDeleteSelected): what relied
	// on it after that mark's snapshot keeps it, what relied on it before
	// is in the snapshot (docs/protocol/cache.md §10.1).
	remarked := time.Now()
	if gen, err = c.remark(ctx, gen, markStart); err != nil {
		return rep, err
	}
	if rep.Protected, err = db.GCProtected(ctx); err != nil {
		return rep, err
	}
	if dry {
		return rep, c.dryReport(ctx, &rep, keptSet, cutoff)
	}
	paused := false
	for {
		if time.Since(remarked) > 10*time.Second {
			next := time.Now()
			if gen, err = c.remark(ctx, gen, remarked); err != nil {
				return rep, err
			}
			remarked = next
		}
		deleted, more, err := db.GCDeleteSelected(ctx, cutoff, time.Now(), remarked)
		if err != nil {
			return rep, fmt.Errorf("delete paths: %w", err)
		}
		if c.cfg.Content != nil && len(deleted) > 0 {
			c.cfg.Content.ForgetNarinfos()
		}
		for _, e := range deleted {
			addPath(&rep, e)
		}
		if !paused && c.cfg.PauseFile != "" {
			paused = true
			c.pause(ctx)
		}
		if err := c.deleteQueued(ctx, &rep); err != nil {
			return rep, err
		}
		if !more {
			break
		}
	}
	if err := c.orphans(ctx, &rep, cutoff, false); err != nil {
		return rep, err
	}
	if err := c.deleteQueued(ctx, &rep); err != nil {
		return rep, err
	}
	return rep, c.pruneLogs(ctx, &rep, keptSet, false)
}

// propagate marks the closure of generation gen and returns the last
// generation.
func (c *Collector) propagate(ctx context.Context, gen int) (int, error) {
	for {
		added, err := c.cfg.DB.GCPropagate(ctx, gen)
		if err != nil {
			return gen, fmt.Errorf("mark closure: %w", err)
		}
		if added == 0 {
			return gen, nil
		}
		gen++
	}
}

// remark marks what evaluations changed since since keep, and unselects
// it.
func (c *Collector) remark(ctx context.Context, gen int, since time.Time) (int, error) {
	db := c.cfg.DB
	ids, err := db.RecentlyChangedEvaluations(ctx, since)
	if err != nil {
		return gen, err
	}
	for _, id := range ids {
		if err := db.GCRootEvaluation(ctx, id); err != nil {
			return gen, err
		}
	}
	gen++
	first := gen
	if err := db.GCMarkRoots(ctx, gen, time.Now()); err != nil {
		return gen, err
	}
	if gen, err = c.propagate(ctx, gen); err != nil {
		return gen, err
	}
	return gen, db.GCUnselectMarked(ctx, first)
}

func (c *Collector) dryReport(ctx context.Context, rep *Report, kept map[string]bool, cutoff time.Time) error {
	db := c.cfg.DB
	err := db.GCSelected(ctx, func(part []storage.GCSweepEntry) error {
		for _, e := range part {
			addPath(rep, e)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := db.GCObjectsFreed(ctx, func(key string, size int64) error {
		addObject(rep, key, size)
		return nil
	}); err != nil {
		return err
	}
	if err := c.orphans(ctx, rep, cutoff, true); err != nil {
		return err
	}
	return c.pruneLogs(ctx, rep, kept, true)
}

// deleteQueued deletes the queued objects, a batch per transaction.
func (c *Collector) deleteQueued(ctx context.Context, rep *Report) error {
	del := func(ctx context.Context, key string) error {
		if c.cfg.Store == nil {
			return nil
		}
		if err := c.cfg.Store.Delete(ctx, key); err != nil && !errors.Is(err, narstore.ErrNotFound) {
			return err
		}
		return nil
	}
	for {
		deleted, err := c.cfg.DB.DeleteQueuedObjects(ctx, nil, 250, del)
		if err != nil {
			return fmt.Errorf("delete objects: %w", err)
		}
		for _, o := range deleted {
			addObject(rep, o.Key, o.FileSize)
		}
		n, _, err := c.cfg.DB.QueuedObjects(ctx)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// orphans queues (or, dry, reports) objects the store holds that no row
// references and that were written before cutoff: uploads whose row was
// never recorded.
func (c *Collector) orphans(ctx context.Context, rep *Report, cutoff time.Time, dry bool) error {
	if c.cfg.Store == nil {
		return nil
	}
	var keys []string
	sizes := map[string]int64{}
	flush := func() error {
		unused, err := c.cfg.DB.GCUnreferenced(ctx, keys)
		if err != nil {
			return err
		}
		if dry {
			for _, k := range unused {
				addObject(rep, k, sizes[k])
			}
		} else if len(unused) > 0 {
			sz := make([]int64, len(unused))
			for i, k := range unused {
				sz[i] = sizes[k]
			}
			if err := c.cfg.DB.GCQueueOrphans(ctx, unused, sz); err != nil {
				return err
			}
		}
		keys, sizes = keys[:0], map[string]int64{}
		return nil
	}
	err := c.cfg.Store.Walk(ctx, func(o narstore.ObjectInfo) error {
		if !o.ModTime.Before(cutoff) {
			return nil
		}
		keys = append(keys, o.Key)
		sizes[o.Key] = o.Size
		if len(keys) == 500 {
			return flush()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list objects: %w", err)
	}
	return flush()
}

func (c *Collector) pruneLogs(ctx context.Context, rep *Report, kept map[string]bool, dry bool) error {
	return c.cfg.DB.GCDroppedEvaluations(ctx, kept, func(ids []string) error {
		for _, id := range ids {
			if dry {
				rep.LogsPruned++
				continue
			}
			n, err := c.cfg.DB.PruneEvaluationLogs(ctx, id)
			if err != nil {
				return fmt.Errorf("prune logs of %s: %w", id, err)
			}
			rep.LogsPruned++
			rep.LogBytes += n
		}
		return nil
	})
}

// pause is the test hook of PauseFile.
func (c *Collector) pause(ctx context.Context) {
	if err := os.WriteFile(c.cfg.PauseFile, nil, 0o600); err != nil {
		c.log.Warn("retention: pause file", "error", err)
		return
	}
	for {
		if _, err := os.Stat(c.cfg.PauseFile); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Collector) record(rep *Report, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "failed"
	}
	mode := "run"
	if rep.DryRun {
		mode = "dry_run"
	}
	c.metrics.duration.WithLabelValues(mode, outcome).Observe(rep.Duration.Seconds())
	if !rep.DryRun {
		c.metrics.paths.Add(float64(rep.PathsFreed))
		c.metrics.objects.Add(float64(rep.ObjectsFreed))
		c.metrics.bytes.Add(float64(rep.BytesFreed))
		c.metrics.logBytes.Add(float64(rep.LogBytes))
		for kind, n := range rep.Protected {
			c.metrics.protected.WithLabelValues(kind).Set(float64(n))
		}
		if sizes, serr := c.cfg.DB.CacheSizes(context.Background()); serr == nil {
			c.metrics.setSizes(sizes)
		}
	}
	attrs := []any{"dry_run", rep.DryRun, "paths_freed", rep.PathsFreed, "objects_freed", rep.ObjectsFreed,
		"bytes_freed", rep.BytesFreed, "evaluations_logs_pruned", rep.LogsPruned, "log_bytes_freed", rep.LogBytes,
		"protected_evaluation", rep.Protected[storage.RootEvaluation], "protected_pushed", rep.Protected[storage.RootPushed],
		"protected_recent", rep.Protected[storage.RootRecent], "duration", rep.Duration.Round(time.Millisecond)}
	if err != nil {
		c.log.Error("retention: collection failed", append(attrs, "error", err)...)
		return
	}
	c.log.Info("retention: collection done", attrs...)
}
