package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// Sizes of WIRE.md §9 and the per-connection bounds of CACHE.md §2-3.
const (
	// safeInflightMessageSize caps every answer of the cache handlers and
	// every message of a read-only cache session.
	safeInflightMessageSize = 2 << 20
	// cacheQueryMaxPaths is the most paths one CacheQuery may name.
	cacheQueryMaxPaths = 1000
	// cacheQueryBudget is how long a query may take before CacheError.
	cacheQueryBudget = 45 * time.Second
	// narServesPerConn bounds the NAR streams of one connection
	// (nar.maxConcurrentServes), so one slow object cannot starve others
	// but a worker cannot open unbounded reads either.
	narServesPerConn = 8
	// cacheQueriesPerConn bounds a connection's concurrent queries.
	cacheQueriesPerConn = 4
)

// cacheScope is which caches a connection may read and write. A worker may
// read and write only the caches of its authorized projects and the caches
// it is a cache peer of; a read-only cache session reads its one cache.
type cacheScope interface {
	readable(ctx context.Context) ([]storage.Cache, error)
	// writable is where an upload or Push query of job jobID may write,
	// and what.
	writable(ctx context.Context, jobID string) (writeScope, error)
}

// workerCacheScope derives the scope from a copy of the session's grant
// on every request, so a reauth that adds a project takes effect at once.
type workerCacheScope struct {
	db *storage.DB
	// jobs and live resolve a job to its project.
	jobs authority.JobLoop
	live *authority.LiveWorker
}

func (w workerCacheScope) readable(ctx context.Context) ([]storage.Cache, error) {
	projects := w.live.Grant().Projects
	var out []storage.Cache
	for _, p := range projects {
		cs, err := w.db.ProjectCaches(ctx, p)
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	peered, err := w.peerCaches(ctx)
	if err != nil {
		return nil, err
	}
	out = append(out, peered...)
	seen := map[string]bool{}
	return slices.DeleteFunc(out, func(c storage.Cache) bool {
		dup := seen[c.ID]
		seen[c.ID] = true
		return dup
	}), nil
}

// peerCaches are the caches the worker is a cache peer of.
func (w workerCacheScope) peerCaches(ctx context.Context) ([]storage.Cache, error) {
	ids := w.live.Grant().Caches
	var out []storage.Cache
	for _, id := range ids {
		c, err := w.db.Cache(ctx, id)
		if errors.Is(err, storage.ErrNotFound) {
			continue // deleted since the grant
		}
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// writable is, for a job the session holds (CACHE.md §4.1: the job scopes
// an upload), the caches of the job's project and what the job produces,
// so a worker serving several projects can put neither another project's
// outputs nor paths its job does not make into a project's caches.
// Without a held job only the caches the worker is a cache peer of are
// writable, with any path: their owner registered the worker for them.
func (w workerCacheScope) writable(ctx context.Context, jobID string) (writeScope, error) {
	if r, ok := w.jobs.(authority.JobUploads); ok && jobID != "" {
		if products, ok := r.JobProducts(w.live, jobID); ok {
			scope := writeScope{jobID: jobID, job: &products}
			if !w.live.Authorized(products.Project) {
				return scope, nil
			}
			var err error
			scope.caches, err = w.db.ProjectCaches(ctx, products.Project)
			return scope, err
		}
	}
	caches, err := w.peerCaches(ctx)
	return writeScope{jobID: jobID, caches: caches}, err
}

// oneCacheScope is a read-only cache session's scope.
type oneCacheScope struct{ cache storage.Cache }

func (o oneCacheScope) readable(context.Context) ([]storage.Cache, error) {
	return []storage.Cache{o.cache}, nil
}
func (o oneCacheScope) writable(context.Context, string) (writeScope, error) {
	return writeScope{}, nil
}

// cacheConn answers the cache and NAR messages of one connection (a
// worker session or a read-only cache session). Work that touches the
// database or storage runs on its own goroutines, so the dispatch loop
// keeps reading control messages.
type cacheConn struct {
	s     *Server
	log   *slog.Logger
	send  func(wire.ServerMessage) error
	scope cacheScope
	// readOnly: a cache session, where unknown paths of a NarRequest are
	// skipped instead of answered NarUnavailable.
	readOnly bool

	ctx     context.Context
	cancel  context.CancelFunc
	tasks   sync.WaitGroup
	serves  chan struct{}
	queries chan struct{}
	// transfers counts NAR streams in flight; lastTransfer is when one
	// last ended (unix nanos). A cache session's idle rule reads both.
	transfers    atomic.Int64
	lastTransfer atomic.Int64
	uploads      *uploads
}

// workerCache is the authority's CacheFactory: the binary cache answers
// each worker session's cache messages within the session's grant.
func (s *Server) workerCache(cs authority.CacheSession) authority.CacheHandler {
	return newCacheConn(cs.Ctx, s, cs.Log, cs.Worker.Send, workerCacheScope{db: s.db, jobs: s.cfg.Jobs, live: cs.Worker}, false)
}

func newCacheConn(parent context.Context, s *Server, log *slog.Logger, send func(wire.ServerMessage) error, scope cacheScope, readOnly bool) *cacheConn {
	ctx, cancel := context.WithCancel(parent)
	c := &cacheConn{
		s: s, log: log, send: send, scope: scope, readOnly: readOnly,
		ctx: ctx, cancel: cancel,
		serves:  make(chan struct{}, narServesPerConn),
		queries: make(chan struct{}, cacheQueriesPerConn),
	}
	c.lastTransfer.Store(time.Now().UnixNano())
	c.uploads = newUploads(c)
	return c
}

// Handle takes one cache message. An UploadChunk's payload has been
// written when it returns, so the caller may release the frame.
func (c *cacheConn) Handle(m wire.ClientMessage) {
	switch m := m.(type) {
	case *wire.CacheQuery:
		c.goQuery(m)
	case *wire.NarRequest:
		for _, p := range m.Paths {
			c.goServe(m.JobID, p, nil)
		}
	case *wire.NarRequestResume:
		c.goServe(m.JobID, m.StorePath, m)
	case *wire.UploadRequest:
		c.uploads.request(m)
	case *wire.UploadChunk:
		c.uploads.chunk(m)
	case *wire.UploadFinished:
		c.uploads.finished(m)
	case *wire.UploadCancel:
		c.uploads.cancel(m.RequestID)
	case *wire.EvalCachePull:
		// No evaluation cache is kept (CACHE.md §6: Miss is always valid).
		c.send(&wire.EvalCachePullResult{JobID: m.JobID, Outcome: &wire.EvalCacheMiss{}})
	case *wire.QueryKnownDerivations:
		c.goKnownDerivations(m)
	}
}

// spawn runs f on its own goroutine, tracked so close can wait for it.
func (c *cacheConn) spawn(f func()) {
	c.tasks.Add(1)
	go func() {
		defer c.tasks.Done()
		f()
	}()
}

// acquire takes a slot of sem unless the connection ends first.
func (c *cacheConn) acquire(sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// Close ends every transfer and upload of the connection and waits.
func (c *cacheConn) Close() {
	c.cancel()
	c.uploads.closeAll()
	c.tasks.Wait()
}

// idleSince is when the connection last had a NAR transfer, or now while
// one is in flight.
func (c *cacheConn) idleSince() time.Time {
	if c.transfers.Load() > 0 {
		return time.Now()
	}
	return time.Unix(0, c.lastTransfer.Load())
}
