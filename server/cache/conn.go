package cache

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// Sizes of docs/protocol/wire.md §9 and the per-connection bounds of docs/protocol/cache.md §2-3.
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

// Scope is which caches a connection may read and write. A worker may
// read and write only the caches of its authorized projects and the caches
// it is a cache peer of (the server derives them from a copy of the
// session's grant on every request); a read-only cache session reads its
// one cache.
type Scope interface {
	Readable(ctx context.Context) ([]storage.Cache, error)
	// Writable is where an upload or Push query of job jobID may write,
	// and what.
	Writable(ctx context.Context, jobID string) (WriteScope, error)
}

// oneCacheScope is a read-only cache session's scope.
type oneCacheScope struct{ cache storage.Cache }

func (o oneCacheScope) Readable(context.Context) ([]storage.Cache, error) {
	return []storage.Cache{o.cache}, nil
}
func (o oneCacheScope) Writable(context.Context, string) (WriteScope, error) {
	return WriteScope{}, nil
}

// Conn answers the cache and NAR messages of one connection (a worker
// session or a read-only cache session). Work that touches the
// database or storage runs on its own goroutines, so the dispatch loop
// keeps reading control messages.
type Conn struct {
	s     *Cache
	log   *slog.Logger
	send  func(wire.ServerMessage) error
	scope Scope
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
	// streams are the NAR streams in flight by (job, path): a new
	// request or resume of one stops the old (goServe).
	streamsMu sync.Mutex
	streams   map[streamKey]*liveStream
}

// NewConn answers the cache messages of one worker session (Conn.Handle)
// within scope, sending through send; ctx ends its transfers.
func (s *Cache) NewConn(ctx context.Context, log *slog.Logger, send func(wire.ServerMessage) error, scope Scope) *Conn {
	return newCacheConn(ctx, s, log, send, scope, false)
}

func newCacheConn(parent context.Context, s *Cache, log *slog.Logger, send func(wire.ServerMessage) error, scope Scope, readOnly bool) *Conn {
	ctx, cancel := context.WithCancel(parent)
	c := &Conn{
		s: s, log: log, send: send, scope: scope, readOnly: readOnly,
		ctx: ctx, cancel: cancel,
		serves:  make(chan struct{}, narServesPerConn),
		queries: make(chan struct{}, cacheQueriesPerConn),
		streams: map[streamKey]*liveStream{},
	}
	c.lastTransfer.Store(time.Now().UnixNano())
	c.uploads = newUploads(c)
	return c
}

// Handle takes one cache message. An UploadChunk's payload has been
// written when it returns, so the caller may release the frame.
func (c *Conn) Handle(m wire.ClientMessage) {
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
		// No evaluation cache is kept (docs/protocol/cache.md §6: Miss is always valid).
		c.send(&wire.EvalCachePullResult{JobID: m.JobID, Outcome: &wire.EvalCacheMiss{}})
	case *wire.QueryKnownDerivations:
		c.goKnownDerivations(m)
	}
}

// spawn runs f on its own goroutine, tracked so close can wait for it.
func (c *Conn) spawn(f func()) {
	c.tasks.Add(1)
	go func() {
		defer c.tasks.Done()
		f()
	}()
}

// acquire takes a slot of sem unless ctx (the connection's or a
// stream's) ends first.
func (c *Conn) acquire(ctx context.Context, sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// Close ends every transfer and upload of the connection and waits.
func (c *Conn) Close() {
	c.cancel()
	c.uploads.closeAll()
	c.tasks.Wait()
}

// idleSince is when the connection last had a NAR transfer, or now while
// one is in flight.
func (c *Conn) idleSince() time.Time {
	if c.transfers.Load() > 0 {
		return time.Now()
	}
	return time.Unix(0, c.lastTransfer.Load())
}
