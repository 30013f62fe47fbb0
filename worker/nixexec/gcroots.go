package nixexec

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// GC roots (docs/protocol/worker.md §7.7): while a job needs store paths it pulled,
// instantiated or built — until they are built with or uploaded — a
// garbage collection on the build machine must not delete them. Each is
// pinned by a symlink <GCRootsDir>/<job>-<name> (the GC treats every
// symlink under /nix/var/nix/gcroots as a root, and the daemon is told of
// each link as an indirect root, so a directory elsewhere works too); the
// job's links go when it ends. A link that cannot be made is logged and the job goes on
// unpinned, as the reference does.

// roots are one job's GC root links.
type roots struct {
	dir, prefix string
	// mu is held across pin's daemon round trips (roots.mu →
	// nix/daemon.Client.mu, docs/LOCKS.md).
	mu     sync.Mutex
	links  []string
	warned bool
}

// pin roots paths for the rest of the job.
func (j *job) pin(ctx context.Context, paths ...string) {
	r := j.roots
	if r == nil || r.dir == "" {
		return
	}
	// No collection may start halfway: a path valid now and pinned
	// after the collection read its roots would go.
	release, err := j.hold(ctx)
	if err != nil {
		return
	}
	defer release()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		r.warn(j, err)
		return
	}
	var links []string
	for _, p := range paths {
		link := filepath.Join(r.dir, r.prefix+filepath.Base(p))
		if err := os.Symlink(p, link); err != nil && !errors.Is(err, fs.ErrExist) {
			r.warn(j, err)
			continue
		}
		r.links = append(r.links, link)
		links = append(links, link)
	}
	// The daemon is told of the links a few at a time (one round trip
	// each), so an evaluation's thousands of .drv files do not wait for
	// one another.
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range min(pinRegistrars, len(links)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < len(links); i = int(next.Add(1)) - 1 {
				if err := j.e.Nix.AddIndirectRoot(ctx, links[i]); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		r.warn(j, *err)
	}
}

// hold opens a window in which the job may have paths in the store that
// no link pins yet (see storegc.go): a collection waits for it to close,
// and it waits for a running collection. The job's goroutines share one
// hold on the gate, so a hold inside a hold never waits.
func (j *job) hold(ctx context.Context) (release func(), err error) {
	if j.e.GC == nil {
		return func() {}, nil
	}
	j.holdMu.Lock()
	defer j.holdMu.Unlock()
	if j.holds == 0 {
		if j.unhold, err = j.e.GC.hold(ctx); err != nil {
			return nil, err
		}
	}
	j.holds++
	var once sync.Once
	return func() {
		once.Do(func() {
			j.holdMu.Lock()
			defer j.holdMu.Unlock()
			if j.holds--; j.holds == 0 {
				j.unhold()
				j.unhold = nil
			}
		})
	}, nil
}

// pinRegistrars is how many links pin registers with the daemon at once.
const pinRegistrars = 4

func (r *roots) warn(j *job, err error) {
	if !r.warned {
		r.warned = true
		j.log.Warn("cannot pin store paths with GC roots; a garbage collection may delete them mid-job", "dir", r.dir, "error", err)
	}
}

// release removes the job's links.
func (r *roots) release() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.links {
		os.Remove(l)
	}
	r.links = nil
}

// ResetGCRoots empties GCRootsDir: links left by a worker that died are
// roots nobody will release. Call it at start-up, before the first job.
func (e *Executor) ResetGCRoots() error {
	if e.GCRootsDir == "" {
		return nil
	}
	entries, err := os.ReadDir(e.GCRootsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, entry := range entries {
		if entry.Type()&fs.ModeSymlink != 0 {
			os.Remove(filepath.Join(e.GCRootsDir, entry.Name()))
		}
	}
	return nil
}
