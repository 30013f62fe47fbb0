package narstore

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// syncData makes the group's temporary files durable.
func syncData(batch []*pendingCommit) error {
	return parallel(len(batch), func(i int) error { return batch[i].f.Sync() })
}

// syncRenames makes the renames into dirs durable.
func syncRenames(dirs map[string]bool) error {
	list := make([]string, 0, len(dirs))
	for d := range dirs {
		list = append(list, d)
	}
	return parallel(len(list), func(i int) error { return syncDir(list[i]) })
}

// parallel runs f(0..n-1), syncParallel at a time, and returns the first
// error by index.
func parallel(n int, f func(int) error) error {
	if n == 1 {
		return f(0)
	}
	errs := make([]error, n)
	sem := make(chan struct{}, syncParallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Group commit: an object becomes visible by a rename of its temporary
// file, and both the file's bytes (before the rename) and the rename
// (before Commit returns) must be durable. Done per object that is two
// fsyncs, a few milliseconds each, which for the thousands of small
// .drv files of a large evaluation is most of its upload time. Commits
// that arrive while a flush runs wait and form the next group: one
// leader syncs the whole group's data, renames every file, syncs the
// renames, and wakes the group. An object's Commit returns only after
// its group is durable, so whatever a caller acknowledges after Commit
// survives a kill of the process and a crash of the machine; a crash
// during a flush loses at most that group's objects, which no caller
// acknowledged and no narinfo names yet.
//
// The group's files, then its directories, are synced concurrently
// (at most syncParallel at once), so the filesystem joins their journal
// commits. syncfs(2) would be one call, but it also waits for every other
// writer's dirty data on the filesystem, which on a shared disk measured
// slower (docs/PERFORMANCE.md).

// syncParallel bounds the concurrent fsyncs of one group.
const syncParallel = 32

// pendingCommit is one object waiting for its group.
type pendingCommit struct {
	f     *os.File // closed by the flush
	final string
	err   error
	done  bool
}

type groupSync struct {
	mu   sync.Mutex
	cond *sync.Cond
	// pending are the objects of the next group.
	pending  []*pendingCommit
	flushing bool
	// onFlush, when set, sees each group's size and time (ObserveGroups).
	onFlush func(objects int, took time.Duration)
	// beforeFlush, when set (tests), runs in the leader before a flush.
	beforeFlush func()
}

func newGroupSync() *groupSync {
	g := &groupSync{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// commit makes f's bytes visible under final, durably, and closes f.
func (g *groupSync) commit(f *os.File, final string) error {
	p := &pendingCommit{f: f, final: final}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending = append(g.pending, p)
	for !p.done {
		if g.flushing {
			g.cond.Wait()
			continue
		}
		batch := g.pending
		g.pending = nil
		g.flushing = true
		g.mu.Unlock()
		if g.beforeFlush != nil {
			g.beforeFlush()
		}
		start := time.Now()
		g.flush(batch)
		took := time.Since(start)
		g.mu.Lock()
		for _, q := range batch {
			q.done = true
		}
		g.flushing = false
		if g.onFlush != nil {
			g.onFlush(len(batch), took)
		}
		g.cond.Broadcast()
	}
	return p.err
}

// flush makes a group durable: data, renames, renames' durability. An
// object whose step fails gets the error and stays invisible (its
// temporary file removed) unless only the last sync failed, when it may
// be visible but is reported as not committed.
func (g *groupSync) flush(batch []*pendingCommit) {
	failAll := func(err error) {
		for _, p := range batch {
			if p.err == nil {
				p.err = err
			}
		}
	}
	if err := syncData(batch); err != nil {
		for _, p := range batch {
			p.f.Close()
			os.Remove(p.f.Name())
		}
		failAll(fmt.Errorf("nar store: %w", err))
		return
	}
	dirs := map[string]bool{}
	for _, p := range batch {
		err := p.f.Close()
		if err == nil {
			err = os.MkdirAll(filepath.Dir(p.final), 0o750)
		}
		// Same key, same bytes: replacing an existing object is harmless.
		if err == nil {
			err = os.Rename(p.f.Name(), p.final)
		}
		if err != nil {
			os.Remove(p.f.Name())
			p.err = fmt.Errorf("nar store: %w", err)
			continue
		}
		dirs[filepath.Dir(p.final)] = true
	}
	if err := syncRenames(dirs); err != nil {
		failAll(fmt.Errorf("nar store: %w", err))
	}
}

// ObserveGroups makes the store tell f the size and the sync time of each
// group it commits (metrics); f runs under the group's lock and must not
// block.
func (l *Local) ObserveGroups(f func(objects int, took time.Duration)) {
	l.group.mu.Lock()
	l.group.onFlush = f
	l.group.mu.Unlock()
}
