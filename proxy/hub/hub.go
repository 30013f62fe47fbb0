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
// The hub does no I/O: the upstream session is a send function (the
// tenant's workersession.Shell's session, through Attach), each downstream worker a
// Downstream whose Send must not block (an Outbox). State changes under
// one mutex; the sends run after it is released, in order.
package hub

import (
	"cmp"
	"log/slog"
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
	// relay: down goes to d as the upstream frame it came in, unchanged
	// (relayFrame).
	relay *upstreamFrame
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
		case f.relay != nil:
			if r, ok := f.d.(Relayer); ok {
				f.relay.taken = r.Relay(f.down, f.relay.frame, f.relay.ver)
			} else {
				f.d.Send(f.down)
			}
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

// relayFrame marks the one send of msg, the message in was decoded from,
// to go as in's frame: a chunk the hub forwards unchanged to one worker
// needs no new encoding (its job ID, path, offset and bytes are the
// server's; docs/protocol/federation.md "Passthrough"). A chunk cut to
// what the worker lacks is a copy and is encoded; a message sent twice
// is never relayed, since the first writer recycles the frame.
func relayFrame(e *effects, msg wire.ServerMessage, in *upstreamFrame) {
	if in == nil {
		return
	}
	at := -1
	for i, f := range e.list {
		if f.down == msg {
			if at >= 0 {
				return
			}
			at = i
		}
	}
	if at >= 0 {
		e.list[at].relay = in
	}
}

// fromUpstream takes one message of the upstream session id
// (Upstream.Handle); in, when set, is the frame a bulk chunk came in.
func (h *Hub) fromUpstream(id uint64, msg wire.ServerMessage, in *upstreamFrame) {
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
	case *wire.CacheStatus, *wire.KnownDerivations, *wire.CacheError:
		h.answerQuery(e, m)
	case *wire.UploadGrant, *wire.UploadCommitted:
		h.answerUpload(e, m)
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
	relayFrame(e, msg, in)
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
