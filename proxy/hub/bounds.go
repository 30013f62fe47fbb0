package hub

import (
	"time"

	"gradient.dev/gradient/wire"
)

// Limits bound what one tenant's upstream session can make its hub hold
// (docs/protocol/federation.md: one tenant never touches another). The tenant's
// server decides what it offers, so every offered candidate, every page
// of a job list and every answer the hub waits for is counted against
// its tenant's limits. Past a limit the excess is dropped (counted in
// gradient_proxy_hub_bounded_total and logged at most once per
// boundLogEvery), never the process: a dropped candidate is only not
// scored behind the proxy, the server still assigns it on a poll.
type Limits struct {
	// BookCandidates bounds the candidates of the mirrored offer book,
	// and on its own the pages of a job list being received (which
	// replaces the book when its final page comes): a tenant holds at
	// most twice this many.
	BookCandidates int
	// BookBytes bounds the memory those candidates hold (as
	// candidateBytes estimates it), the book and a job list being
	// received each.
	BookBytes int64
	// PendingQueries bounds the cache queries passed upstream and not
	// answered yet; past it a worker's query is answered with a
	// CacheError at once.
	PendingQueries int
	// PendingUploads bounds the uploads passed upstream and not
	// committed yet; past it a worker's upload is told to retry.
	PendingUploads int
}

// DefaultLimits: a tenant's book holds up to 100,000 candidates in at
// most 64 MiB. The server offers one session a few hundred candidates
// at a time; only a full job list names every ready build the proxy may
// run, and a ready build's candidate (its direct inputs) takes one or
// two KiB, so tens of thousands fit. 64 MiB also keeps the book, sent
// to a worker as its job list, within the worker's queue (OutboxBytes,
// the encoding being smaller than the estimate), which would otherwise
// cut the worker off.
var DefaultLimits = Limits{
	BookCandidates: 100_000,
	BookBytes:      64 << 20,
	PendingQueries: 10_000,
	PendingUploads: 10_000,
}

// withDefaults fills the limits left zero (or negative).
func (l Limits) withDefaults() Limits {
	if l.BookCandidates <= 0 {
		l.BookCandidates = DefaultLimits.BookCandidates
	}
	if l.BookBytes <= 0 {
		l.BookBytes = DefaultLimits.BookBytes
	}
	if l.PendingQueries <= 0 {
		l.PendingQueries = DefaultLimits.PendingQueries
	}
	if l.PendingUploads <= 0 {
		l.PendingUploads = DefaultLimits.PendingUploads
	}
	return l
}

// bound names what a limit dropped or refused (the "bound" label).
type bound int

const (
	boundCandidates bound = iota // an offered or listed candidate past BookCandidates
	boundBytes                   // an offered or listed candidate past BookBytes
	boundQueries                 // a worker's cache query past PendingQueries
	boundUploads                 // a worker's upload past PendingUploads
	nBounds
)

var boundNames = [nBounds]string{"book_candidates", "book_bytes", "pending_queries", "pending_uploads"}

// drops counts dropped items by bound.
type drops [nBounds]int

func (d *drops) any() bool { return *d != drops{} }

// boundLogEvery spaces the log lines of a hub's drops: a flood of
// candidates is one line per interval, with the count since the last.
const boundLogEvery = 10 * time.Second

// Per-value costs of a candidate in memory (64-bit): a string or slice
// header, a pointer, and what the map entry, the order slice and the
// allocator add per candidate. Each string's bytes are an allocation
// of their own, which the allocator rounds up to its size class (about
// 8 bytes on average for store paths).
const (
	stringCost    = 16 + 8
	sliceCost     = 24
	candidateCost = 96 + 16 + 16 + 48 // JobCandidate, map key, bookOrder entry, map slot overhead
	reqPathCost   = stringCost + 8    // RequiredPath
	cacheInfoCost = 16
	requireCost   = stringCost + sliceCost
)

// candidateBytes estimates the heap a candidate holds once decoded: its
// strings' bytes and the headers that point at them. Cheap: nothing is
// encoded or allocated.
func candidateBytes(c *wire.JobCandidate) int64 {
	n := candidateCost + len(c.JobID)
	for i := range c.RequiredPaths {
		n += reqPathCost + len(c.RequiredPaths[i].Path)
		if c.RequiredPaths[i].CacheInfo != nil {
			n += cacheInfoCost
		}
	}
	for _, p := range c.DrvPaths {
		n += stringCost + len(p)
	}
	for _, p := range c.OutputPaths {
		n += stringCost + len(p)
	}
	if r := c.Requirement; r != nil {
		n += requireCost + len(r.Architecture)
		for _, f := range r.RequiredFeatures {
			n += stringCost + len(f)
		}
	}
	return int64(n)
}

// candidateSet is a bounded collection of candidates: its count and
// estimated bytes.
type candidateSet struct {
	count int
	bytes int64
}

// fits reports whether one more candidate of size n stays within l,
// and otherwise which bound it passes.
func (s candidateSet) fits(l Limits, n int64) (bool, bound) {
	switch {
	case s.count >= l.BookCandidates:
		return false, boundCandidates
	case s.bytes+n > l.BookBytes:
		return false, boundBytes
	}
	return true, 0
}

func (s *candidateSet) add(n int64)    { s.count++; s.bytes += n }
func (s *candidateSet) remove(n int64) { s.count--; s.bytes -= n }

// bounded is what the hub's limits dropped: in the call under way (for
// the counter, once the lock is released) and since the last log line.
type bounded struct {
	now, since drops
	lastLog    time.Time
}

// drop notes n dropped items of bound b.
func (x *bounded) drop(b bound, n int) {
	x.now[b] += n
	x.since[b] += n
}

// take returns the call's drops and, when a log line is due (at most
// one per boundLogEvery), the drops since the last one. A call that
// dropped nothing costs a comparison (no clock read).
func (x *bounded) take() (call, logged drops, due bool) {
	if !x.now.any() {
		return drops{}, drops{}, false
	}
	call, x.now = x.now, drops{}
	now := time.Now()
	if now.Sub(x.lastLog) < boundLogEvery {
		return call, drops{}, false
	}
	logged, x.since, x.lastLog = x.since, drops{}, now
	return call, logged, true
}
