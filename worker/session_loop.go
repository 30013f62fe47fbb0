package worker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// sessionEnd is how a session ended; it decides the next reconnect delay.
type sessionEnd int

const (
	endFailed  sessionEnd = iota // no session: dial or handshake failed
	endServed                    // the session ran and was lost or closed
	endDrained                   // the server drained or refused it: back off further
	endStopped                   // the worker is stopping
	endRefused                   // the server rejected it and OnRejected stops dialing
)

func (e sessionEnd) String() string {
	return [...]string{"failed", "lost", "drained by the server", "stopped", "rejected by the server"}[e]
}

// liveSession is one established session's job loop (docs/protocol/jobs.md §2, §5,
// §11, §12): it requests work, answers assignments, runs jobs and reports
// them, and ends them all when the session ends.
type liveSession struct {
	w    *Worker
	sess *session.WorkerSession
	auth *session.WorkerAuth
	log  *slog.Logger
	// cache runs the jobs' cache queries, pulls and uploads on this session.
	cache *CacheClient
	// scoring feeds the scorer goroutine, which answers offers and list
	// pages in order, off the dispatch goroutine (store checks run Nix).
	scoring chan scoreTask
	// fwd, with Config.Forwarder, takes every job and cache message.
	fwd ForwardHandler

	// mu guards what follows. Lock order (docs/LOCKS.md): ls.mu →
	// runningJob.mu and → the worker's slots.mu (assign); no send under it.
	mu   sync.Mutex
	jobs map[string]*runningJob
	// credential is the deploy key of the next AssignJob (Credential).
	credential []byte
	drained    bool // the server sent Draining or Reject: request nothing more
	refused    bool // a Reject whose OnRejected hook stops dialing
	stopping   bool // the worker is stopping: request and accept nothing more
	jobsDone   sync.WaitGroup
}

func newLiveSession(w *Worker, sess *session.WorkerSession, auth *session.WorkerAuth) *liveSession {
	cache := NewCacheClient(sess.Send)
	cache.TempDir = w.cfg.TempDir
	cache.Moved = w.m.narMoved
	cache.Transferred = w.m.narTransferred
	cache.Overflowed = w.m.narPullOverflowed
	cache.Presigned, cache.PresignedMoved, cache.Log = w.m.presignedRequest, w.m.presignedMoved, w.log
	return &liveSession{w: w, sess: sess, auth: auth, jobs: map[string]*runningJob{}, cache: cache, scoring: make(chan scoreTask, 256),
		log: w.log.With("session_version", sess.Version())}
}

// run serves the session until it ends. Cancelling ctx stops the worker:
// Draining, running jobs cancelled and reported Canceled, close.
func (ls *liveSession) run(ctx context.Context) sessionEnd {
	ls.log.Info("session established", "authorized", ls.sess.AuthorizedPeers, "failed_peers", len(ls.sess.FailedPeers),
		"capabilities", capabilityNames(ls.sess.Capabilities))
	ls.start()
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			ls.stop()
			close(stopped)
		case <-ls.sess.Done():
		}
	}()
	go ls.heartbeat()
	if ls.fwd == nil {
		go ls.scorer()
	}

	// The reader's context is the session's own: cancelling it would close
	// the socket before the stop sequence's reports went out.
	recvCtx, cancelRecv := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRecv()
	for {
		m, err := ls.sess.Recv(recvCtx)
		if err != nil {
			break
		}
		ls.dispatch(m)
	}
	ls.abortAll(errSessionLost)
	ls.mu.Lock()
	stopping, drained, refused := ls.stopping, ls.drained, ls.refused
	ls.mu.Unlock()
	if ls.fwd != nil {
		reason := ls.sess.Reason()
		if stopping {
			reason = "worker stopping"
		}
		ls.fwd.Ended(reason)
	}
	if stopping {
		<-stopped // the stop sequence may still wait for reports
		return endStopped
	}
	ls.log.Info("session ended", "reason", ls.sess.Reason())
	if refused {
		return endRefused
	}
	if drained {
		return endDrained
	}
	return endServed
}

// start sends the session-start sequence (docs/protocol/jobs.md §2, docs/protocol/connection.md
// Server Restart): RequestJobList, then one RequestJob per kind the worker
// can run, whether or not the kind has a free slot. After a reconnect the
// old session's aborted jobs may still hold their slots; the server must
// learn of the new session's kinds at once, not at the next heartbeat, and
// an AssignJob arriving while a slot is still busy is declined as usual.
func (ls *liveSession) start() {
	if ls.sess.Capabilities.Build {
		hw := ls.w.capabilities()
		ls.send(&hw)
	}
	if ls.fwd != nil {
		return // the forwarder polls
	}
	ls.send(&wire.RequestJobList{})
	for _, kind := range jobKinds {
		if ls.canRun(kind) {
			ls.send(&wire.RequestJob{Kind: kind})
		}
	}
}

// sendHost re-sends what the worker reports of its host after it changed
// (Worker.HostChanged): the server schedules builds by WorkerCapabilities,
// so only a session that may build sends it, as start does.
func (ls *liveSession) sendHost() {
	if ls.sess.Capabilities.Build {
		hw := ls.w.capabilities()
		ls.send(&hw)
	}
	ls.send(ls.w.metrics())
}

// heartbeat sends WorkerMetrics and capacity-gated RequestJobs (§12.1).
func (ls *liveSession) heartbeat() {
	t := time.NewTicker(ls.w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ls.sess.Done():
			return
		case <-t.C:
		}
		ls.send(ls.w.metrics())
		ls.requestFreeSlots()
	}
}

// requestFreeSlots sends one RequestJob per enabled kind with a free slot,
// unless the session is draining.
func (ls *liveSession) requestFreeSlots() {
	for _, kind := range jobKinds {
		ls.requestIfFree(kind)
	}
}

func (ls *liveSession) requestIfFree(kind wire.JobKind) {
	if ls.canRun(kind) && ls.w.slots.free(kind) {
		ls.send(&wire.RequestJob{Kind: kind})
	}
}

// canRun: jobs of kind are negotiated, there is an executor to run them,
// and neither side is draining.
func (ls *liveSession) canRun(kind wire.JobKind) bool {
	return ls.fwd == nil && !ls.quiet() && kindEnabled(ls.sess.Capabilities, kind) && ls.w.cfg.Executor != nil
}

// quiet: the server or the worker is draining.
func (ls *liveSession) quiet() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.drained || ls.stopping
}

func (ls *liveSession) send(m wire.ClientMessage) {
	if err := ls.sess.Send(m); err != nil {
		ls.log.Debug("send failed", "message", m.WireName(), "error", err)
	}
}

func (ls *liveSession) dispatch(m wire.ServerMessage) {
	if ch, ok := m.(*wire.AuthChallenge); ok {
		// Answered here rather than by session.HandleAuth: the peers
		// file's `*` entry answers peers not listed explicitly.
		ls.log.Info("server challenged the session", "peers", ch.Peers)
		ls.send(answerChallenge(ls.w.currentTokens(), ch))
		return
	}
	if ls.fwd == nil && ls.cache.HandleMessage(m) {
		return
	}
	handled, err := session.HandleAuth(ls.sess, ls.auth, m)
	if handled {
		if err != nil {
			ls.log.Warn("answering the server's auth failed", "error", err)
		} else if u, ok := m.(*wire.AuthUpdate); ok {
			ls.log.Info("authorization updated", "authorized", u.AuthorizedPeers, "failed_peers", len(u.FailedPeers))
		}
		return
	}
	if ls.fwd != nil {
		ls.forward(m)
		return
	}
	switch m := m.(type) {
	case *wire.AssignJob:
		ls.assign(m)
	case *wire.AbortJob:
		ls.abort(m)
	case *wire.JobListChunk:
		ls.scoring <- scoreTask{m.Candidates, m.IsFinal, false}
	case *wire.JobOffer:
		ls.scoring <- scoreTask{m.Candidates, true, true}
	case *wire.ServerDraining:
		ls.log.Info("server is draining: finishing running jobs, then reconnecting")
		ls.markDrained()
	case *wire.ServerReject:
		ls.log.Warn("server refused the session", "code", m.Code, "reason", m.Reason)
		if ls.w.rejected(m.Code, m.Reason) {
			ls.mu.Lock()
			ls.refused = true
			ls.mu.Unlock()
		}
		ls.markDrained()
	case *wire.ServerError:
		ls.log.Warn("server reported an error", "code", m.Code, "message", m.Message)
	case *wire.Credential:
		// For the AssignJob that follows (docs/protocol/jobs.md §5.2); never logged.
		ls.mu.Lock()
		if m.Kind == wire.CredentialSSHKey {
			ls.credential = bytes.Clone(m.Data)
		}
		ls.mu.Unlock()
	default:
		ls.log.Debug("ignoring message", "message", m.WireName())
	}
}

// forward hands m to the Forwarder, after the worker's own bookkeeping
// of a Draining or Reject.
func (ls *liveSession) forward(m wire.ServerMessage) {
	switch m := m.(type) {
	case *wire.ServerDraining:
		ls.log.Info("server is draining: the forwarder finishes its jobs")
		ls.markDrained()
	case *wire.ServerReject:
		ls.log.Warn("server refused the session", "code", m.Code, "reason", m.Reason)
		if ls.w.rejected(m.Code, m.Reason) {
			ls.mu.Lock()
			ls.refused = true
			ls.mu.Unlock()
		}
		ls.markDrained()
	}
	ls.fwd.Handle(m)
	switch m.(type) {
	case *wire.NarPush, *wire.EvalCacheChunk:
		// The forwarder is done with the chunk: its frame takes the next.
		ls.sess.Reader.Release()
	}
}

// markDrained stops requests and closes the session once no job is left.
// A forwarded session's jobs run elsewhere: the server closes it.
func (ls *liveSession) markDrained() {
	ls.mu.Lock()
	ls.drained = true
	idle := len(ls.jobs) == 0 && ls.fwd == nil
	ls.mu.Unlock()
	if idle {
		ls.sess.Close(session.CloseNormal, "server draining")
	}
}

// assign answers AssignJob (docs/protocol/jobs.md §5.3) and starts an accepted job.
func (ls *liveSession) assign(m *wire.AssignJob) {
	kind, known := jobKind(m.Job)
	ls.mu.Lock()
	// A credential belongs to the AssignJob right after it, taken or not.
	key := ls.credential
	ls.credential = nil
	if j := ls.jobs[m.JobID]; j != nil {
		// Re-sent by the server: keep running, report under the new ID.
		j.setAssignmentID(m.AssignmentID)
		ls.mu.Unlock()
		ls.send(&wire.AssignJobResponse{JobID: m.JobID, Accepted: true})
		return
	}
	var reason string
	switch {
	case !known:
		reason = "unknown job type"
	case ls.drained || ls.stopping:
		reason = "worker is draining"
	case ls.w.cfg.Executor == nil:
		reason = "worker has no job executor"
	case !kindEnabled(ls.sess.Capabilities, kind):
		reason = fmt.Sprintf("capability for %s jobs not enabled", kindName(kind))
	case m.Cluster != nil:
		reason = "cluster jobs are not supported"
	default:
		if ok, used, max := ls.w.slots.take(kind); !ok {
			reason = fmt.Sprintf("at capacity (%d/%d)", used, max)
		}
	}
	var j *runningJob
	if reason == "" {
		j = newRunningJob(Assignment{JobID: m.JobID, Kind: kind, Job: m.Job, Cluster: m.Cluster, SSHKey: key}, m.AssignmentID)
		ls.jobs[m.JobID] = j
		ls.jobsDone.Add(1)
	}
	ls.mu.Unlock()
	if j == nil {
		ls.log.Info("declined job", "job", m.JobID, "reason", reason)
		ls.send(&wire.AssignJobResponse{JobID: m.JobID, Accepted: false, Reason: &reason})
		return
	}
	ls.log.Info("accepted job", "job", m.JobID, "assignment", m.AssignmentID, "kind", kindName(kind))
	ls.send(&wire.AssignJobResponse{JobID: m.JobID, Accepted: true})
	ls.w.m.jobsRunning.WithLabelValues(kindName(kind)).Inc()
	go ls.runJob(j)
	ls.requestIfFree(kind)
}

// abort handles AbortJob (docs/protocol/jobs.md §11): the job's executor is cancelled
// and the job reports JobFailed Aborted; an unknown job is ignored.
func (ls *liveSession) abort(m *wire.AbortJob) {
	ls.mu.Lock()
	j := ls.jobs[m.JobID]
	ls.mu.Unlock()
	if j == nil {
		ls.log.Debug("abort for a job not running", "job", m.JobID)
		return
	}
	ls.log.Info("aborting job", "job", m.JobID, "reason", m.Reason)
	j.cancel(errAbortedByServer)
}

// abortAll cancels every running job with cause.
func (ls *liveSession) abortAll(cause error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, j := range ls.jobs {
		j.cancel(cause)
	}
}

// stop is the worker's stop sequence on this session (docs/protocol/jobs.md §12.3):
// Draining; running jobs may finish within the drain budget; then cancel
// what is left so each reports Canceled, wait a bounded time for the
// reports, and close (letting queued messages out).
func (ls *liveSession) stop() {
	ls.mu.Lock()
	ls.stopping = true
	running := len(ls.jobs)
	ls.mu.Unlock()
	ls.send(&wire.ClientDraining{})
	reported := make(chan struct{})
	go func() {
		ls.jobsDone.Wait()
		close(reported)
	}()
	if running > 0 && ls.w.cfg.DrainTimeout > 0 && ls.drain(running, reported) {
		ls.sess.Close(session.CloseNormal, "worker stopping")
		return
	}
	ls.log.Info("stopping session: aborting running jobs", "running_jobs", ls.runningJobs())
	ls.abortAll(errWorkerStopping)
	t := time.NewTimer(ls.w.cfg.StopReportWait)
	defer t.Stop()
	select {
	case <-reported:
	case <-t.C:
		ls.log.Warn("jobs did not report in time; closing anyway")
	}
	ls.sess.Close(session.CloseNormal, "worker stopping")
}

// drain waits for the running jobs to finish and report, until the drain
// budget runs out, AbortDrain closes or the session ends; it reports
// whether every job finished.
func (ls *liveSession) drain(running int, reported <-chan struct{}) bool {
	budget := ls.w.cfg.DrainTimeout
	ls.log.Info("draining: letting running jobs finish", "running_jobs", running, "drain_timeout", budget.String())
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case <-reported:
		ls.log.Info("drained: every job finished")
		return true
	case <-t.C:
		ls.log.Warn("drain timeout expired", "drain_timeout", budget.String(), "running_jobs", ls.runningJobs())
	case <-ls.w.cfg.AbortDrain:
		ls.log.Warn("drain aborted (second signal)", "running_jobs", ls.runningJobs())
	case <-ls.sess.Done():
	}
	return false
}

func (ls *liveSession) runningJobs() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.jobs)
}

func kindName(k wire.JobKind) string {
	if k == wire.JobKindBuild {
		return "build"
	}
	return "flake"
}
