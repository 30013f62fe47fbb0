// Package hub forwards one tenant's jobs between the tenant's Gradient
// server and the tenant's workers behind the proxy (docs/protocol/federation.md "Job
// Forwarding", "Passthrough"). A Hub holds only its tenant's workers and
// its tenant's upstream session, so no frame crosses tenants.
//
// The hub mirrors the upstream offer book and hands each worker the
// candidates it can run, forwards the best score per candidate (changes
// only, coalesced by FlushScores), turns a worker's RequestJob into an
// upstream poll and gives the upstream AssignJob to the best capable
// waiting worker (or declines), routes reports by job_id and drops the
// ones for jobs the worker does not own, and passes cache messages
// through under fresh query and request IDs: nothing is stored on the
// proxy, the tenant's server is the cache. NAR pulls to a worker that
// reads slower than the server sends are paused and resumed per pull
// (narflow.go) rather than the worker cut off.
//
// The hub does no I/O: the upstream session is a send function (a
// worker.Worker's session, through Forward), each downstream worker a
// Downstream whose Send must not block (an Outbox). State changes under
// one mutex; the sends run after it is released, in order.
package hub

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"gradient.dev/gradient/wire"
)

// Downstream is one worker session behind the proxy as the hub sees it.
// The hub calls Session, WorkerID, Capabilities, Host, Draining, Backlog
// and WhenDrained with h.mu held, so they may take only leaf locks (the
// session's and its Outbox's, docs/LOCKS.md); Send and Close only after
// releasing it.
type Downstream interface {
	// Session is unique per session for the process lifetime.
	Session() uint64
	WorkerID() string
	// Send queues m for the worker; it must not block (see Outbox), and
	// it keeps no NarPush or EvalCacheChunk Data once it returns: the
	// upstream frame they alias takes the next chunk.
	Send(m wire.ServerMessage)
	// Capabilities are the negotiated ones (fetch, eval, build).
	Capabilities() wire.GradientCapabilities
	// Host is the worker's latest WorkerCapabilities, nil if none came.
	Host() *wire.WorkerCapabilities
	// Draining: the worker sent Draining.
	Draining() bool
	// Close ends the worker's session.
	Close(reason string)
	// Backlog is the bytes queued for the worker that its session has
	// not taken yet (Outbox.Backlog): NAR pulls pause above a mark.
	Backlog() int
	// WhenDrained calls f once, on a goroutine of its own and never
	// before it returns, when the backlog is below bytes
	// (Outbox.WhenDrained).
	WhenDrained(bytes int, f func())
}

// Reasons the hub gives.
const (
	ReasonNoWorker     = "no capable worker waiting behind the proxy"
	ReasonUpstreamLost = "upstream session to the tenant's server lost"
	reasonNotHeld      = "job not held by this worker"
	// The proxy's limits on what waits for the tenant's server.
	reasonTooManyQueries = "too many cache queries waiting for the tenant's server behind the proxy"
	reasonTooManyUploads = "too many uploads waiting for the tenant's server behind the proxy"
)

// Hub is one tenant's forwarding state.
type Hub struct {
	tenant string
	log    *slog.Logger
	m      *Metrics
	// limits bound what the upstream session makes the hub hold
	// (bounds.go); read and set under mu (Set.SetLimits).
	limits Limits

	// mu guards what follows. Lock order (docs/LOCKS.md): h.mu → a
	// member's session lock (Downstream's getters) and → its Outbox's
	// (Backlog, WhenDrained). A method with an *effects parameter, and
	// every helper it calls, runs with h.mu held; Hub.run sends what it
	// collected once h.mu is released.
	mu      sync.Mutex
	up      *upLink
	upSeq   uint64
	workers map[uint64]*member
	// book is the mirrored offer book, by job ID, in arrival order.
	book      map[string]wire.JobCandidate
	bookOrder []string
	// listing collects the pages of an upstream JobListChunk answer;
	// listAsked: a RequestJobList is outstanding upstream.
	listing   []wire.JobCandidate
	listAsked bool
	// inBook and inListing are what book and listing hold, each within
	// limits (invariant); bounded what the limits dropped.
	inBook, inListing candidateSet
	bounded           bounded
	// credential is the upstream's for the AssignJob right after it.
	credential *wire.Credential
	jobs       map[string]*job
	queries    map[string]queryRoute  // by upstream query ID
	uploads    map[uint64]uploadRoute // by upstream request ID
	nextUpload uint64
	// sentScores is the best score per candidate last sent upstream;
	// dirty the candidates whose best may have changed since.
	sentScores map[string]wire.CandidateScore
	dirty      map[string]bool
	// waiters are the members whose RequestJob of a kind is unanswered,
	// by wire.JobKind, in no order (mirrors member.waiting; a member's
	// place is its waitAt): an AssignJob looks at them only, not at
	// every worker of the tenant. A slice: the scan is the hot part.
	waiters [2][]*member
}

type upLink struct {
	id       uint64
	send     func(wire.ClientMessage) error
	draining bool
}

type member struct {
	d       Downstream
	waiting [2]bool // by wire.JobKind: a RequestJob is unanswered
	waitAt  [2]int  // the member's index in Hub.waiters while waiting
	scores  map[string]wire.CandidateScore
	uploads map[uint64]uint64 // the worker's request ID → upstream's
	jobs    int
	// drainWatched: a paused NAR pull waits for the worker's queue to
	// drain (WhenDrained was called).
	drainWatched bool
}

type job struct {
	id, assignment string
	owner          uint64
	kind           wire.JobKind
	accepted       bool // the worker answered AssignJob with accepted
	// ended: the worker reported the job's end before its answer to the
	// AssignJob (reports ride the bulk lane and may overtake it); the
	// answer, when it comes, goes upstream and releases the job.
	ended   bool
	cluster *wire.ClusterMembership
	started bool // StartCluster came for its attempt
	// pulls are the job's NAR pulls by store path (narflow.go); they go
	// with the job.
	pulls map[string]*pull
}

type queryRoute struct {
	worker uint64
	id     string
}

type uploadRoute struct {
	worker uint64
	id     uint64
}

// New makes the hub of one tenant; m may be nil.
func New(tenant string, log *slog.Logger, m *Metrics) *Hub {
	if log == nil {
		log = slog.Default()
	}
	return &Hub{tenant: tenant, log: log.With("tenant", tenant), m: m, limits: DefaultLimits,
		workers: map[uint64]*member{}, book: map[string]wire.JobCandidate{}, jobs: map[string]*job{},
		queries: map[string]queryRoute{}, uploads: map[uint64]uploadRoute{},
		sentScores: map[string]wire.CandidateScore{}, dirty: map[string]bool{}}
}

// setWaiting records whether w's RequestJob of kind is unanswered, in
// the member and in the hub's index of waiters. Called with h.mu held.
func (h *Hub) setWaiting(w *member, kind wire.JobKind, on bool) {
	if w.waiting[kind] == on {
		return
	}
	w.waiting[kind] = on
	ws := h.waiters[kind]
	if on {
		w.waitAt[kind] = len(ws)
		h.waiters[kind] = append(ws, w)
		return
	}
	// The last waiter takes w's place.
	i, last := w.waitAt[kind], len(ws)-1
	ws[i] = ws[last]
	ws[i].waitAt[kind] = i
	ws[last] = nil
	h.waiters[kind] = ws[:last]
}

// notWaiting clears every kind w waits for. Called with h.mu held.
func (h *Hub) notWaiting(w *member) {
	for _, kind := range []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild} {
		h.setWaiting(w, kind, false)
	}
}

// effects are the sends and closes one call decided, run in order once
// the lock is released.
type effects struct {
	list []effect
}

func (e *effects) add(f effect) { e.list = append(e.list, f) }

// effectsPool recycles the lists of the per-message calls (FromWorker,
// fromUpstream), so forwarding a message allocates none.
var effectsPool = sync.Pool{New: func() any { return &effects{list: make([]effect, 0, 4)} }}

func getEffects() *effects { return effectsPool.Get().(*effects) }

// putEffects returns e once run; a list grown large (a book replaced) is
// left to the collector.
func putEffects(e *effects) {
	if cap(e.list) > 64 {
		return
	}
	clear(e.list)
	e.list = e.list[:0]
	effectsPool.Put(e)
}

type effect struct {
	d     Downstream
	down  wire.ServerMessage
	close string
	up    func(wire.ClientMessage) error
	upMsg wire.ClientMessage
}

func (e *effects) toWorker(d Downstream, m wire.ServerMessage) {
	e.add(effect{d: d, down: m})
}

func (e *effects) closeWorker(d Downstream, reason string) {
	e.add(effect{d: d, close: reason})
}

// toUpstream queues m for the upstream session in e, sent by Hub.run
// after the unlock. Called with h.mu held.
func (h *Hub) toUpstream(e *effects, m wire.ClientMessage) {
	if h.up == nil {
		return
	}
	e.add(effect{up: h.up.send, upMsg: m})
}

func (h *Hub) run(e *effects) {
	for _, f := range e.list {
		switch {
		case f.up != nil:
			if err := f.up(f.upMsg); err != nil {
				h.log.Debug("upstream send failed", "message", f.upMsg.WireName(), "error", err)
			}
		case f.close != "":
			f.d.Close(f.close)
		default:
			f.d.Send(f.down)
		}
	}
}

// attach makes send the tenant's upstream session and asks for its
// offer book and for a job for every waiting worker's kind.
func (h *Hub) attach(send func(wire.ClientMessage) error) uint64 {
	h.mu.Lock()
	if h.up != nil {
		// A tenant has one upstream session at a time; one still
		// attached is over.
		old := h.up.id
		h.mu.Unlock()
		h.detach(old, "replaced by a new upstream session")
		h.mu.Lock()
	}
	h.upSeq++
	h.up = &upLink{id: h.upSeq, send: send}
	id := h.up.id
	var e effects
	h.startListing()
	h.toUpstream(&e, &wire.RequestJobList{})
	for _, kind := range []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild} {
		for _, m := range h.sortedMembers() {
			if m.waiting[kind] && !m.d.Draining() {
				h.toUpstream(&e, &wire.RequestJob{Kind: kind})
			}
		}
	}
	h.mu.Unlock()
	h.log.Info("upstream session attached")
	h.run(&e)
	return id
}

// detach is the end of upstream session id: every job is aborted on its
// worker, open queries and uploads fail, and the tenant's workers get
// Draining and are closed (docs/protocol/federation.md "Upstream lost").
func (h *Hub) detach(id uint64, reason string) {
	h.mu.Lock()
	if h.up == nil || h.up.id != id {
		h.mu.Unlock()
		return
	}
	h.up = nil
	var e effects
	why := ReasonUpstreamLost + ": " + reason
	for _, j := range sortedJobs(h.jobs) {
		if m := h.workers[j.owner]; m != nil && !j.ended {
			e.toWorker(m.d, &wire.AbortJob{JobID: j.id, Reason: why})
		}
	}
	for _, q := range h.queries {
		if m := h.workers[q.worker]; m != nil {
			e.toWorker(m.d, &wire.CacheError{QueryID: q.id, Message: why})
		}
	}
	for _, u := range h.uploads {
		if m := h.workers[u.worker]; m != nil {
			e.toWorker(m.d, &wire.UploadCommitted{RequestID: u.id, Outcome: &wire.UploadRetry{Reason: why}})
		}
	}
	for _, m := range h.sortedMembers() {
		e.toWorker(m.d, &wire.ServerDraining{})
		e.closeWorker(m.d, why)
		h.notWaiting(m)
		m.scores = map[string]wire.CandidateScore{}
		m.uploads = map[uint64]uint64{}
		m.jobs = 0
	}
	aborted := len(h.jobs)
	h.jobs = map[string]*job{}
	h.queries = map[string]queryRoute{}
	h.uploads = map[uint64]uploadRoute{}
	h.book = map[string]wire.JobCandidate{}
	h.bookOrder = nil
	h.listing, h.listAsked = nil, false
	h.inBook, h.inListing = candidateSet{}, candidateSet{}
	h.credential = nil
	h.sentScores = map[string]wire.CandidateScore{}
	h.dirty = map[string]bool{}
	workers := len(h.workers)
	h.mu.Unlock()
	h.log.Warn("upstream session lost: aborting the tenant's jobs and closing its workers",
		"reason", reason, "jobs", aborted, "workers", workers)
	h.m.lost(h.tenant)
	h.m.book(h.tenant, candidateSet{})
	h.run(&e)
}

// Join adds a worker session of the tenant. It asks for the book with
// its own RequestJobList at session start.
func (h *Hub) Join(d Downstream) {
	h.mu.Lock()
	if old := h.workers[d.Session()]; old != nil {
		h.notWaiting(old) // a session joined twice: its new member waits for nothing yet
	}
	h.workers[d.Session()] = &member{d: d, scores: map[string]wire.CandidateScore{}, uploads: map[uint64]uint64{}}
	h.mu.Unlock()
}

// Leave removes a worker session: each job it held fails upstream as
// transient (an unanswered assignment is declined), its uploads are
// cancelled and its queries forgotten (docs/protocol/federation.md "Worker lost").
func (h *Hub) Leave(d Downstream, reason string) {
	h.mu.Lock()
	m := h.workers[d.Session()]
	if m == nil {
		h.mu.Unlock()
		return
	}
	delete(h.workers, d.Session())
	h.notWaiting(m)
	var e effects
	lost := 0
	for _, j := range sortedJobs(h.jobs) {
		if j.owner != d.Session() {
			continue
		}
		delete(h.jobs, j.id)
		if j.ended {
			continue // reported already
		}
		lost++
		if !j.accepted {
			r := "worker behind the proxy lost before answering: " + reason
			h.toUpstream(&e, &wire.AssignJobResponse{JobID: j.id, Accepted: false, Reason: &r})
			continue
		}
		h.toUpstream(&e, &wire.JobFailed{JobID: j.id, AssignmentID: j.assignment, Kind: wire.FailureTransient,
			Error: "worker behind the proxy lost: " + reason})
	}
	for _, upID := range sortedValues(m.uploads) {
		delete(h.uploads, upID)
		h.toUpstream(&e, &wire.UploadCancel{RequestID: upID})
	}
	for id, q := range h.queries {
		if q.worker == d.Session() {
			delete(h.queries, id)
		}
	}
	for id := range m.scores {
		h.dirty[id] = true
	}
	h.mu.Unlock()
	if lost > 0 {
		h.log.Warn("worker behind the proxy lost with jobs: failing them upstream as transient",
			"worker", d.WorkerID(), "jobs", lost, "reason", reason)
	}
	h.run(&e)
}

// FromUpstream takes one message of the upstream session id.
func (h *Hub) fromUpstream(id uint64, msg wire.ServerMessage) {
	h.mu.Lock()
	if h.up == nil || h.up.id != id {
		h.mu.Unlock()
		return
	}
	e := getEffects()
	defer putEffects(e)
	outcome := "" // of an AssignJob, counted once the lock is released
	held := h.inBook
	switch m := msg.(type) {
	case *wire.JobOffer:
		h.addToBook(e, m.Candidates)
	case *wire.JobListChunk:
		h.addToListing(m.Candidates)
		if m.IsFinal {
			h.replaceBook(e, h.listing)
			h.listing, h.listAsked = nil, false
			h.inListing = candidateSet{}
		}
	case *wire.Credential:
		h.credential = m
	case *wire.AssignJob:
		outcome = h.assign(e, m)
	case *wire.AbortJob:
		if j := h.jobs[m.JobID]; j != nil {
			h.toOwner(e, j, m)
		}
	case *wire.StartCluster:
		h.startCluster(e, m)
	case *wire.ServerClusterSignal:
		for _, w := range h.attemptWorkers(m.Attempt) {
			e.toWorker(w.d, m)
		}
	case *wire.AbortCluster:
		for _, w := range h.attemptWorkers(m.Attempt) {
			e.toWorker(w.d, m)
		}
		// Held members are dropped without a report; started ones
		// report JobFailed Aborted.
		for _, j := range sortedJobs(h.jobs) {
			if j.cluster != nil && j.cluster.Attempt == m.Attempt && !j.started {
				h.release(j)
			}
		}
	case *wire.CacheStatus:
		if q, ok := h.takeQuery(m.QueryID); ok {
			c := *m
			c.QueryID = q.id
			e.toWorker(h.workers[q.worker].d, &c)
		}
	case *wire.KnownDerivations:
		if q, ok := h.takeQuery(m.QueryID); ok {
			c := *m
			c.QueryID = q.id
			e.toWorker(h.workers[q.worker].d, &c)
		}
	case *wire.CacheError:
		if q, ok := h.takeQuery(m.QueryID); ok {
			c := *m
			c.QueryID = q.id
			e.toWorker(h.workers[q.worker].d, &c)
		}
	case *wire.UploadGrant:
		_, skip := m.Target.(*wire.GrantSkip)
		if u, ok := h.uploadRoute(m.RequestID, skip); ok {
			c := *m
			c.RequestID = u.id
			e.toWorker(h.workers[u.worker].d, &c)
		}
	case *wire.UploadCommitted:
		if u, ok := h.uploadRoute(m.RequestID, true); ok {
			c := *m
			c.RequestID = u.id
			e.toWorker(h.workers[u.worker].d, &c)
		}
	case *wire.NarStreamHeader:
		h.narHeader(e, m)
	case *wire.NarPush:
		h.m.narPassed(h.tenant, "download", len(m.Data))
		h.narPush(e, m)
	case *wire.NarUnavailable:
		h.narEnded(e, m.JobID, m.StorePath, m, true)
	case *wire.NarAbort:
		h.narEnded(e, m.JobID, m.StorePath, m, false)
	case *wire.EvalCachePullResult:
		h.toJobOwner(e, m.JobID, m)
	case *wire.EvalCacheChunk:
		h.toJobOwner(e, m.JobID, m)
	case *wire.ImportResult:
		h.toJobOwner(e, m.JobID, m)
	case *wire.ServerDraining:
		// The server stops: poll no more, let running jobs report
		// until it closes the session.
		h.up.draining = true
	case *wire.ServerError:
		h.log.Warn("the tenant's server reported an error", "code", m.Code, "message", m.Message)
	default:
		h.log.Debug("ignoring upstream message", "message", msg.WireName())
	}
	changed, now := h.inBook != held, h.inBook
	dropped, logged, due := h.bounded.take()
	limits := h.limits
	h.mu.Unlock()
	if outcome != "" {
		h.m.assigned(h.tenant, outcome)
	}
	if changed {
		h.m.book(h.tenant, now)
	}
	h.reportBounded(limits, dropped, logged, due)
	h.run(e)
}

// FromWorker takes one job or cache message of a worker session.
func (h *Hub) FromWorker(d Downstream, msg wire.ClientMessage) {
	h.mu.Lock()
	w := h.workers[d.Session()]
	if w == nil {
		h.mu.Unlock()
		return
	}
	e := getEffects()
	defer putEffects(e)
	switch m := msg.(type) {
	case *wire.RequestJob:
		if m.Kind != wire.JobKindFlake && m.Kind != wire.JobKindBuild {
			break
		}
		h.setWaiting(w, m.Kind, true)
		if h.polling() && !d.Draining() {
			h.toUpstream(e, m)
		}
	case *wire.RequestJobList:
		h.sendList(e, w)
		if h.polling() && !h.listAsked {
			h.startListing()
			h.toUpstream(e, m)
		}
	case *wire.RequestJobChunk:
		for _, s := range m.Scores {
			if c, ok := h.book[s.JobID]; ok && canSee(d, c) {
				w.scores[s.JobID] = s
				h.dirty[s.JobID] = true
			}
		}
	case *wire.AssignJobResponse:
		h.assignResponse(e, w, m)
	case *wire.ClientDraining:
		h.notWaiting(w)
	case *wire.WorkerCapabilities, *wire.WorkerMetrics:
		// Read live by the rules; the upstream session reports the pool.
	case *wire.JobUpdate:
		h.report(e, w, m.JobID, m, false)
	case *wire.JobCompleted:
		h.report(e, w, m.JobID, m, true)
	case *wire.JobFailed:
		h.report(e, w, m.JobID, m, true)
	case *wire.LogChunk:
		h.report(e, w, m.JobID, m, false)
	case *wire.BuildProgress:
		h.report(e, w, m.JobID, m, false)
	case *wire.EvalProgress:
		h.report(e, w, m.JobID, m, false)
	case *wire.EvalMessage:
		h.report(e, w, m.JobID, m, false)
	case *wire.ImportRequest:
		h.report(e, w, m.JobID, m, false)
	case *wire.ClientClusterSignal:
		if h.holdsAttempt(w, m.Attempt) {
			h.toUpstream(e, m)
		} else {
			h.dropped(d, m, "no member of the attempt held")
		}
	default:
		h.cacheFromWorker(e, w, msg)
	}
	dropped, logged, due := h.bounded.take()
	limits := h.limits
	h.mu.Unlock()
	h.reportBounded(limits, dropped, logged, due)
	h.run(e)
}

// polling: an upstream session is up and not draining.
func (h *Hub) polling() bool { return h.up != nil && !h.up.draining }

// cacheFromWorker passes a cache message through to the tenant's server
// under fresh IDs (docs/protocol/cache.md): the answers come back to this worker only.
func (h *Hub) cacheFromWorker(e *effects, w *member, msg wire.ClientMessage) {
	up := h.up != nil
	switch m := msg.(type) {
	case *wire.CacheQuery:
		if !up || !h.jobOK(w, m.JobID, true) {
			e.toWorker(w.d, &wire.CacheError{QueryID: m.QueryID, Message: h.refusal(up)})
			return
		}
		if !h.roomForQuery() {
			e.toWorker(w.d, &wire.CacheError{QueryID: m.QueryID, Message: reasonTooManyQueries})
			return
		}
		c := *m
		c.QueryID = h.newQuery(w, m.QueryID)
		h.toUpstream(e, &c)
	case *wire.QueryKnownDerivations:
		if !up || !h.jobOK(w, m.JobID, true) {
			e.toWorker(w.d, &wire.CacheError{QueryID: m.QueryID, Message: h.refusal(up)})
			return
		}
		if !h.roomForQuery() {
			e.toWorker(w.d, &wire.CacheError{QueryID: m.QueryID, Message: reasonTooManyQueries})
			return
		}
		c := *m
		c.QueryID = h.newQuery(w, m.QueryID)
		h.toUpstream(e, &c)
	case *wire.NarRequest:
		if !up || !h.jobOK(w, m.JobID, false) {
			for _, p := range m.Paths {
				e.toWorker(w.d, &wire.NarAbort{JobID: m.JobID, StorePath: p, Reason: h.refusal(up)})
			}
			return
		}
		j := h.jobs[m.JobID]
		for _, p := range m.Paths {
			j.pullOf(p).requested(0, true)
		}
		h.toUpstream(e, m)
	case *wire.NarRequestResume:
		if !up || !h.jobOK(w, m.JobID, false) {
			e.toWorker(w.d, &wire.NarAbort{JobID: m.JobID, StorePath: m.StorePath, Reason: h.refusal(up)})
			return
		}
		h.jobs[m.JobID].pullOf(m.StorePath).requested(m.ReceivedBytes, false)
		h.toUpstream(e, m)
	case *wire.EvalCachePull:
		if !up || !h.jobOK(w, m.JobID, false) {
			e.toWorker(w.d, &wire.EvalCachePullResult{JobID: m.JobID, Outcome: &wire.EvalCacheMiss{}})
			return
		}
		h.toUpstream(e, m)
	case *wire.UploadRequest:
		if !up || !h.jobOK(w, m.JobID, true) {
			e.toWorker(w.d, &wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadRetry{Reason: h.refusal(up)}})
			return
		}
		if old, ok := w.uploads[m.RequestID]; ok {
			delete(h.uploads, old) // the worker reused its ID
			delete(w.uploads, m.RequestID)
		}
		if len(h.uploads) >= h.limits.PendingUploads {
			h.bounded.drop(boundUploads, 1)
			e.toWorker(w.d, &wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadRetry{Reason: reasonTooManyUploads}})
			return
		}
		h.nextUpload++
		id := h.nextUpload
		h.uploads[id] = uploadRoute{worker: w.d.Session(), id: m.RequestID}
		w.uploads[m.RequestID] = id
		c := *m
		c.RequestID = id
		h.toUpstream(e, &c)
	case *wire.UploadChunk:
		if id, ok := w.uploads[m.RequestID]; ok {
			h.m.narPassed(h.tenant, "upload", len(m.Data))
			c := *m
			c.RequestID = id
			h.toUpstream(e, &c)
		}
	case *wire.UploadFinished:
		if id, ok := w.uploads[m.RequestID]; ok {
			c := *m
			c.RequestID = id
			h.toUpstream(e, &c)
		}
	case *wire.UploadCancel:
		if id, ok := w.uploads[m.RequestID]; ok {
			delete(w.uploads, m.RequestID)
			delete(h.uploads, id)
			h.toUpstream(e, &wire.UploadCancel{RequestID: id})
		}
	default:
		h.log.Debug("ignoring worker message", "message", msg.WireName())
	}
}

func (h *Hub) refusal(up bool) string {
	if !up {
		return "no upstream session to the tenant's server"
	}
	return reasonNotHeld
}

// jobOK: the worker holds jobID (or, where allowed, names no job).
func (h *Hub) jobOK(w *member, jobID string, noneOK bool) bool {
	if jobID == "" {
		return noneOK
	}
	j := h.jobs[jobID]
	return j != nil && j.owner == w.d.Session()
}

func (h *Hub) newQuery(w *member, id string) string {
	var b [16]byte
	rand.Read(b[:])
	q := hex.EncodeToString(b[:])
	h.queries[q] = queryRoute{worker: w.d.Session(), id: id}
	return q
}

func (h *Hub) takeQuery(id string) (queryRoute, bool) {
	q, ok := h.queries[id]
	if ok {
		delete(h.queries, id)
	}
	return q, ok && h.workers[q.worker] != nil
}

// uploadRoute maps an upstream request ID back; done forgets it.
func (h *Hub) uploadRoute(id uint64, done bool) (uploadRoute, bool) {
	u, ok := h.uploads[id]
	if !ok {
		return u, false
	}
	w := h.workers[u.worker]
	if done {
		delete(h.uploads, id)
		if w != nil {
			delete(w.uploads, u.id)
		}
	}
	return u, w != nil
}

// report forwards a worker's report of a job it owns; end releases it.
// A report may overtake the worker's AssignJobResponse (it rides the
// other lane): the owner runs the job either way.
func (h *Hub) report(e *effects, w *member, jobID string, m wire.ClientMessage, end bool) {
	j := h.jobs[jobID]
	if j == nil || j.owner != w.d.Session() || j.ended {
		h.dropped(w.d, m, reasonNotHeld)
		return
	}
	h.toUpstream(e, m)
	switch {
	case end && j.accepted:
		h.release(j)
	case end:
		j.ended = true
	}
}

func (h *Hub) dropped(d Downstream, m wire.ClientMessage, why string) {
	h.log.Debug("dropping a worker's message", "worker", d.WorkerID(), "message", m.WireName(), "why", why)
	h.m.droppedMessage(h.tenant, m.WireName())
}

func (h *Hub) release(j *job) {
	delete(h.jobs, j.id)
	if w := h.workers[j.owner]; w != nil {
		w.jobs--
	}
}

func (h *Hub) toOwner(e *effects, j *job, m wire.ServerMessage) {
	if w := h.workers[j.owner]; w != nil {
		e.toWorker(w.d, m)
	}
}

func (h *Hub) toJobOwner(e *effects, jobID string, m wire.ServerMessage) {
	if j := h.jobs[jobID]; j != nil {
		h.toOwner(e, j, m)
	}
}

// assign hands an upstream AssignJob to the best capable waiting worker,
// or declines it; it returns the outcome to count ("" for a re-sent job).
func (h *Hub) assign(e *effects, m *wire.AssignJob) string {
	cred := h.credential
	h.credential = nil
	if j := h.jobs[m.JobID]; j != nil {
		// Re-sent by the server: the owner re-adopts it.
		j.assignment = m.AssignmentID
		h.toOwner(e, j, m)
		return ""
	}
	kind, known := jobKind(m.Job)
	var best *member
	if known && h.polling() {
		best = h.pick(kind, m)
	}
	if best == nil {
		r := ReasonNoWorker
		h.toUpstream(e, &wire.AssignJobResponse{JobID: m.JobID, Accepted: false, Reason: &r})
		return "declined"
	}
	h.removeFromBook(m.JobID)
	h.jobs[m.JobID] = &job{id: m.JobID, assignment: m.AssignmentID, owner: best.d.Session(), kind: kind, cluster: m.Cluster}
	best.jobs++
	h.setWaiting(best, kind, false)
	if cred != nil && needsFetch(m.Job) && best.d.Capabilities().Fetch {
		e.toWorker(best.d, cred)
	}
	e.toWorker(best.d, m)
	return "forwarded"
}

// ranksBefore is pick's order on the hub's own state: a worker waiting
// for the kind, then one with a score for the job, the better score,
// fewer jobs, the older session. It is total, so pick may test it before
// asking a worker's session whether it may take the job.
func ranksBefore(kind wire.JobKind, job string, a, b *member) bool {
	if a.waiting[kind] != b.waiting[kind] {
		return a.waiting[kind]
	}
	sa, oka := a.scores[job]
	sb, okb := b.scores[job]
	if oka != okb {
		return oka
	}
	if oka {
		if c := compareScores(sa, sb); c != 0 {
			return c < 0
		}
	}
	if a.jobs != b.jobs {
		return a.jobs < b.jobs
	}
	return a.d.Session() < b.d.Session()
}

// pick is the best capable worker for m: waiting for its kind (a
// cluster member may also go to a worker that is not), not draining, by
// its score for the job, then fewer jobs, then the older session.
// Called with h.mu held; takes each candidate's session lock
// (Downstream.Draining, and Capabilities and Host through canRun).
func (h *Hub) pick(kind wire.JobKind, m *wire.AssignJob) *member {
	var best *member
	// Only a cluster member may go to a worker that is not waiting: for
	// any other job the waiters of its kind are all the candidates.
	candidates := h.waiters[kind]
	if m.Cluster != nil {
		candidates = slices.Collect(maps.Values(h.workers))
	}
	for _, w := range candidates {
		// The order is the hub's own state; whether the worker may take
		// the job asks its session (and the jobs, for a cluster): the
		// cheap test first, so most workers are passed over by it.
		if best != nil && !ranksBefore(kind, m.JobID, w, best) {
			continue
		}
		if m.Cluster == nil && !w.waiting[kind] {
			continue
		}
		if w.d.Draining() || !canRun(w.d, m.Job) {
			continue
		}
		if m.Cluster != nil && h.holdsAttempt(w, m.Cluster.Attempt) {
			continue
		}
		best = w
	}
	return best
}

// assignResponse forwards the worker's answer to a job it was handed.
func (h *Hub) assignResponse(e *effects, w *member, m *wire.AssignJobResponse) {
	j := h.jobs[m.JobID]
	if j == nil || j.owner != w.d.Session() {
		h.dropped(w.d, m, reasonNotHeld)
		return
	}
	h.toUpstream(e, m)
	if m.Accepted && !j.ended {
		j.accepted = true
		return
	}
	h.release(j)
}

// holdsAttempt: w owns a member of the cluster attempt.
func (h *Hub) holdsAttempt(w *member, attempt string) bool {
	for _, j := range h.jobs {
		if j.owner == w.d.Session() && j.cluster != nil && j.cluster.Attempt == attempt {
			return true
		}
	}
	return false
}

// attemptWorkers are the workers holding a member of the attempt.
func (h *Hub) attemptWorkers(attempt string) []*member {
	seen := map[uint64]bool{}
	var out []*member
	for _, j := range sortedJobs(h.jobs) {
		if j.cluster == nil || j.cluster.Attempt != attempt || seen[j.owner] {
			continue
		}
		if w := h.workers[j.owner]; w != nil {
			seen[j.owner] = true
			out = append(out, w)
		}
	}
	return out
}

// startCluster sends StartCluster to every worker holding a member, the
// roster naming the workers behind the proxy with their zone and
// endpoint instead of the proxy.
func (h *Hub) startCluster(e *effects, m *wire.StartCluster) {
	holders := map[wire.ClusterAddress]*member{}
	for _, j := range h.jobs {
		if j.cluster != nil && j.cluster.Attempt == m.Attempt {
			j.started = true
			if w := h.workers[j.owner]; w != nil {
				holders[wire.ClusterAddress{Role: j.cluster.Role, Index: j.cluster.Index}] = w
			}
		}
	}
	if len(holders) == 0 {
		return
	}
	c := *m
	c.Roster = slices.Clone(m.Roster)
	for i, p := range c.Roster {
		w := holders[wire.ClusterAddress{Role: p.Role, Index: p.Index}]
		if w == nil {
			continue
		}
		p.Worker = w.d.WorkerID()
		p.Zone, p.Endpoint = nil, nil
		if host := w.d.Host(); host != nil {
			p.Zone, p.Endpoint = host.Zone, host.Endpoint
		}
		c.Roster[i] = p
	}
	for _, w := range h.attemptWorkers(m.Attempt) {
		e.toWorker(w.d, &c)
	}
}

// addToBook mirrors a JobOffer and offers each worker what it can run.
// A candidate the book has no room for is dropped (an update of one it
// holds that does not fit leaves the one held).
func (h *Hub) addToBook(e *effects, cands []wire.JobCandidate) {
	var fresh []wire.JobCandidate
	for i := range cands {
		c := &cands[i]
		n := candidateBytes(c)
		room := h.inBook
		old, held := h.book[c.JobID]
		if held {
			room.remove(candidateBytes(&old))
		}
		if ok, b := room.fits(h.limits, n); !ok {
			h.bounded.drop(b, 1)
			continue
		}
		room.add(n)
		h.inBook = room
		if !held {
			h.bookOrder = append(h.bookOrder, c.JobID)
		}
		h.book[c.JobID] = *c
		fresh = append(fresh, *c)
	}
	h.offer(e, fresh)
}

// addToListing collects a JobListChunk's candidates, those the listing
// has room for.
func (h *Hub) addToListing(cands []wire.JobCandidate) {
	for i := range cands {
		n := candidateBytes(&cands[i])
		if ok, b := h.inListing.fits(h.limits, n); !ok {
			h.bounded.drop(b, 1)
			continue
		}
		h.inListing.add(n)
		h.listing = append(h.listing, cands[i])
	}
}

// startListing: a full list was asked for; its pages start anew.
func (h *Hub) startListing() {
	h.listAsked = true
	h.listing = nil
	h.inListing = candidateSet{}
}

// roomForQuery reports whether one more query may wait for the tenant's
// server, counting a refusal.
func (h *Hub) roomForQuery() bool {
	if len(h.queries) < h.limits.PendingQueries {
		return true
	}
	h.bounded.drop(boundQueries, 1)
	return false
}

// reportBounded counts one call's drops and logs the drops since the
// last line when one is due. Called without the lock (with the limits
// read under it).
func (h *Hub) reportBounded(l Limits, dropped, logged drops, due bool) {
	if !dropped.any() {
		return
	}
	h.m.boundedDrops(h.tenant, dropped)
	if !due {
		return
	}
	args := []any{"book_candidates_max", l.BookCandidates, "book_bytes_max", l.BookBytes,
		"pending_queries_max", l.PendingQueries, "pending_uploads_max", l.PendingUploads}
	for b, n := range logged {
		if n > 0 {
			args = append(args, "dropped_"+boundNames[b], n)
		}
	}
	h.log.Warn("the tenant's server passes the proxy's bounds: dropping the excess (logged at most every "+boundLogEvery.String()+")", args...)
}

// replaceBook takes a full list: candidates gone are dropped, new ones
// offered.
func (h *Hub) replaceBook(e *effects, cands []wire.JobCandidate) {
	old := h.book
	h.book = make(map[string]wire.JobCandidate, len(cands))
	h.bookOrder = h.bookOrder[:0]
	// The listing was within the limits, so is its first of each ID.
	h.inBook = candidateSet{}
	var fresh []wire.JobCandidate
	for _, c := range cands {
		if _, dup := h.book[c.JobID]; dup {
			continue
		}
		h.inBook.add(candidateBytes(&c))
		h.book[c.JobID] = c
		h.bookOrder = append(h.bookOrder, c.JobID)
		if _, ok := old[c.JobID]; !ok {
			fresh = append(fresh, c)
		}
	}
	for id := range old {
		if _, ok := h.book[id]; !ok {
			h.forgetCandidate(id)
		}
	}
	h.offer(e, fresh)
}

func (h *Hub) removeFromBook(id string) {
	c, ok := h.book[id]
	if !ok {
		return
	}
	h.inBook.remove(candidateBytes(&c))
	delete(h.book, id)
	h.bookOrder = slices.DeleteFunc(h.bookOrder, func(s string) bool { return s == id })
	h.forgetCandidate(id)
}

func (h *Hub) forgetCandidate(id string) {
	for _, w := range h.workers {
		delete(w.scores, id)
	}
	delete(h.sentScores, id)
	delete(h.dirty, id)
}

// offer sends each worker the candidates it can run, as JobOffer pages.
func (h *Hub) offer(e *effects, cands []wire.JobCandidate) {
	if len(cands) == 0 {
		return
	}
	for _, w := range h.sortedMembers() {
		if w.d.Draining() {
			continue
		}
		var mine []wire.JobCandidate
		for _, c := range cands {
			if canSee(w.d, c) {
				mine = append(mine, c)
			}
		}
		for _, page := range wire.CandidatePages(mine) {
			e.toWorker(w.d, &wire.JobOffer{Candidates: page})
		}
	}
}

// sendList answers a worker's RequestJobList from the mirrored book.
func (h *Hub) sendList(e *effects, w *member) {
	var mine []wire.JobCandidate
	for _, id := range h.bookOrder {
		if c := h.book[id]; canSee(w.d, c) {
			mine = append(mine, c)
		}
	}
	pages := wire.CandidatePages(mine)
	if len(pages) == 0 {
		e.toWorker(w.d, &wire.JobListChunk{IsFinal: true})
		return
	}
	for i, p := range pages {
		e.toWorker(w.d, &wire.JobListChunk{Candidates: p, IsFinal: i == len(pages)-1})
	}
}

// FlushScores sends upstream the best score per candidate where it
// changed since the last flush (the proxy's wiring calls it once per
// second), then polls once more for every kind a worker waits for, as a
// worker does after scoring an offer.
func (h *Hub) FlushScores() {
	h.mu.Lock()
	if !h.polling() || len(h.dirty) == 0 {
		h.dirty = map[string]bool{}
		h.mu.Unlock()
		return
	}
	var scores []wire.CandidateScore
	for _, id := range slices.Sorted(maps.Keys(h.dirty)) {
		best, ok := h.bestScore(id)
		if !ok {
			continue
		}
		if prev, sent := h.sentScores[id]; sent && prev == best {
			continue
		}
		h.sentScores[id] = best
		scores = append(scores, best)
	}
	h.dirty = map[string]bool{}
	var e effects
	for len(scores) > 0 {
		n := min(len(scores), wire.MaxCandidatesPerPage)
		h.toUpstream(&e, &wire.RequestJobChunk{Scores: scores[:n:n], IsFinal: n == len(scores)})
		scores = scores[n:]
	}
	if len(e.list) > 0 {
		for _, kind := range []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild} {
			for _, w := range h.sortedMembers() {
				if w.waiting[kind] && !w.d.Draining() {
					h.toUpstream(&e, &wire.RequestJob{Kind: kind})
				}
			}
		}
	}
	h.mu.Unlock()
	h.run(&e)
}

func (h *Hub) bestScore(id string) (wire.CandidateScore, bool) {
	var best wire.CandidateScore
	found := false
	for _, w := range h.workers {
		s, ok := w.scores[id]
		if ok && (!found || compareScores(s, best) < 0) {
			best, found = s, true
		}
	}
	return best, found
}

// compareScores orders scores best first: outputs present, then less to
// download, then fewer missing paths.
func compareScores(a, b wire.CandidateScore) int {
	if a.OutputsPresent != b.OutputsPresent {
		if a.OutputsPresent {
			return -1
		}
		return 1
	}
	return cmp.Or(cmp.Compare(a.MissingNarSize, b.MissingNarSize), cmp.Compare(a.MissingCount, b.MissingCount))
}

func (h *Hub) sortedMembers() []*member {
	out := make([]*member, 0, len(h.workers))
	for _, w := range h.workers {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b *member) int { return cmp.Compare(a.d.Session(), b.d.Session()) })
	return out
}

func sortedJobs(jobs map[string]*job) []*job {
	out := make([]*job, 0, len(jobs))
	for _, j := range jobs {
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b *job) int { return cmp.Compare(a.id, b.id) })
	return out
}

func sortedValues(m map[uint64]uint64) []uint64 {
	out := make([]uint64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// Holds reports whether a session of workerID owns a forwarded job that
// has not ended (the Hetzner reconciler never deletes such a VM).
func (h *Hub) Holds(workerID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, j := range h.jobs {
		if w := h.workers[j.owner]; w != nil && !j.ended && w.d.WorkerID() == workerID {
			return true
		}
	}
	return false
}

// Pending counts the build candidates of the mirrored offer book per
// Nix system: jobs the tenant's server would hand the proxy's workers.
// Flake candidates and builtin jobs name no system and are not counted.
func (h *Hub) Pending() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for _, c := range h.book {
		if c.Requirement != nil && c.Requirement.Architecture != "builtin" && c.Requirement.Architecture != "" {
			out[c.Requirement.Architecture]++
		}
	}
	return out
}

// RefreshBook asks the upstream for its full offer list, unless one is
// outstanding: candidates another worker of the server took leave the
// book only with a full list.
func (h *Hub) RefreshBook() {
	h.mu.Lock()
	var e effects
	if h.polling() && !h.listAsked {
		h.startListing()
		h.toUpstream(&e, &wire.RequestJobList{})
	}
	h.mu.Unlock()
	h.run(&e)
}
