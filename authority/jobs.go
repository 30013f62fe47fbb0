package authority

import (
	"maps"
	"slices"
	"sync/atomic"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// JobLoop is the job side of worker sessions (docs/protocol/jobs.md): it decides which
// job a RequestJob gets and consumes the worker's reports. The authority
// owns the sessions and their authorization, the cache its messages; the
// job loop owns jobs. The server's durable scheduler implements it, the
// proxy its forwarding hub; tests plug in simpler ones.
//
// Calls for one session arrive in the session's message order from its
// dispatch goroutine, so they must not block on the network; sends go
// through LiveWorker.Send, which queues.
type JobLoop interface {
	// SessionStarted: w is live and may be offered and assigned jobs.
	SessionStarted(w *LiveWorker)
	// HandleJobMessage receives every job message of w: RequestJob,
	// RequestJobList, RequestJobChunk, AssignJobResponse, JobUpdate,
	// JobCompleted, JobFailed, LogChunk, BuildProgress, EvalProgress,
	// EvalMessage, ImportRequest, ClusterSignal, and WorkerCapabilities,
	// WorkerMetrics (every heartbeat) and ClientDraining after the
	// authority recorded them on w.
	HandleJobMessage(w *LiveWorker, m wire.ClientMessage)
	// SessionEnded: w is gone (disconnect, heartbeat timeout, server
	// stop); its running jobs must be re-queued.
	SessionEnded(w *LiveWorker, reason string)
}

// NoJobs is the job loop of an authority without one (a cache-only
// server): a job list is one final, empty page and an import is refused.
type NoJobs struct{}

func (NoJobs) SessionStarted(*LiveWorker)       {}
func (NoJobs) SessionEnded(*LiveWorker, string) {}

func (NoJobs) HandleJobMessage(w *LiveWorker, m wire.ClientMessage) {
	switch m := m.(type) {
	case *wire.RequestJobList:
		w.Send(&wire.JobListChunk{IsFinal: true})
	case *wire.ImportRequest:
		w.Send(RefuseImport(m))
	}
}

// JobUploads is implemented by a JobLoop that knows the jobs it handed
// out. The cache accepts a worker's uploads only for a job the session
// holds, only of what that job produces, and only into the caches of the
// job's project; without it a worker may write only the caches it is a
// cache peer of.
type JobUploads interface {
	// JobProducts is what jobID may upload if w holds it.
	JobProducts(w *LiveWorker, jobID string) (JobProducts, bool)
}

// JobProducts is what a running job may upload.
type JobProducts struct {
	Project string
	// What names the job in refusals ("build of /nix/store/…drv").
	What string
	// Outputs are a build job's output paths, known before it runs.
	Outputs []string
	// ContentAddressed: the job may also upload self-certifying paths,
	// whose content the server checks against their CA field. A fetch's
	// sources and an evaluation's .drv files and sources are known only
	// once made, but Nix content-addresses all of them.
	ContentAddressed bool
}

var liveWorkerSeq atomic.Uint64

// LiveWorker is one established worker session as the job loop sees it.
// Its getters (Authorized, Grant, ProjectAbilities, Capabilities,
// WorkerCapabilities, WorkerMetrics, Draining) take the session's lock, a
// leaf: a caller may hold its own lock (docs/LOCKS.md). Send may wait
// for room on the session's lane (up to its send timeout): the job loop
// calls it without holding a lock.
type LiveWorker struct {
	// Session is unique per session for the process lifetime: a worker
	// that reconnects is a new LiveWorker.
	Session  uint64
	WorkerID string
	Version  uint16

	conn *workerConn
	send func(wire.ServerMessage) error
	out  *session.Writer[wire.ServerMessage]
}

func newLiveWorker(conn *workerConn, version uint16, send func(wire.ServerMessage) error) *LiveWorker {
	return &LiveWorker{Session: liveWorkerSeq.Add(1), WorkerID: conn.workerID, Version: version, conn: conn, send: send}
}

// Send queues m on the session; it fails once the session is gone.
func (w *LiveWorker) Send(m wire.ServerMessage) error { return w.send(m) }

// Writer is the session's writer, for callers that encode a message
// before deciding how to queue it (Writer.Encode, Offer, SendFrame); nil
// for a LiveWorker made for a test, which has only Send.
func (w *LiveWorker) Writer() *session.Writer[wire.ServerMessage] { return w.out }

// Close starts closing this session with code and reason (what is
// queued goes out first) and does not wait; a newer session of the same
// worker is untouched, unlike Authority.Disconnect.
func (w *LiveWorker) Close(code int, reason string) {
	w.conn.mu.Lock()
	sess := w.conn.sess
	w.conn.mu.Unlock()
	if sess != nil {
		go sess.Close(code, reason)
	}
}

// Drop ends this session at once with 1008 and reason, for a worker
// that stopped reading: what is queued is discarded and its close frame
// is not waited for.
func (w *LiveWorker) Drop(reason string) {
	w.conn.mu.Lock()
	sess := w.conn.sess
	w.conn.mu.Unlock()
	if sess != nil {
		sess.Drop(reason)
	}
}

// Authorized reports whether the session may run jobs of project.
func (w *LiveWorker) Authorized(project string) bool {
	w.conn.mu.Lock()
	defer w.conn.mu.Unlock()
	return slices.Contains(w.conn.grant.Projects, project)
}

// Grant is a copy of what the session is granted now; a reauth may add
// to it later.
func (w *LiveWorker) Grant() Grant {
	w.conn.mu.Lock()
	defer w.conn.mu.Unlock()
	return w.conn.grant.Clone()
}

// ProjectAbilities are what the worker may do for each authorized
// project (the registration's enable_fetch / enable_eval / enable_build).
func (w *LiveWorker) ProjectAbilities() map[string]Abilities {
	w.conn.mu.Lock()
	defer w.conn.mu.Unlock()
	return maps.Clone(w.conn.grant.ProjectAbilities)
}

// Capabilities are the negotiated capabilities (fetch, eval, build).
func (w *LiveWorker) Capabilities() wire.GradientCapabilities {
	w.conn.mu.Lock()
	defer w.conn.mu.Unlock()
	return w.conn.capabilities
}

// WorkerCapabilities is the latest WorkerCapabilities, nil if none came:
// such a worker never gets build jobs.
func (w *LiveWorker) WorkerCapabilities() *wire.WorkerCapabilities {
	w.conn.mu.Lock()
	defer w.conn.mu.Unlock()
	return w.conn.workerCaps
}

// WorkerMetrics is the latest heartbeat's WorkerMetrics (load, free
// RAM), nil until the first.
func (w *LiveWorker) WorkerMetrics() *wire.WorkerMetrics {
	w.conn.mu.Lock()
	defer w.conn.mu.Unlock()
	return w.conn.workerLoad
}

// Draining: the worker sent Draining; assign it nothing more.
func (w *LiveWorker) Draining() bool {
	w.conn.mu.Lock()
	defer w.conn.mu.Unlock()
	return w.conn.draining
}

// RefuseImport answers an ImportRequest (import from derivation, v32+)
// the server will not build: the worker fails that attribute and the
// evaluation goes on.
func RefuseImport(m *wire.ImportRequest) *wire.ImportResult {
	drv := ""
	if len(m.DrvPaths) > 0 {
		drv = m.DrvPaths[0]
	}
	return &wire.ImportResult{JobID: m.JobID, RequestID: m.RequestID, Outcome: &wire.ImportUnknown{DrvPath: drv}}
}
