package worker

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

// liveSession is one established session's job loop (docs/protocol/jobs.md §2, §5,
// §11, §12), the worker's workersession.SessionHandler: it requests work,
// answers assignments, runs jobs and reports them, and ends them all when
// the session ends.
type liveSession struct {
	w   *Worker
	s   *workersession.Session
	log *slog.Logger
	// cache runs the jobs' cache queries, pulls and uploads on this session.
	cache *CacheClient
	// scoring feeds the scorer goroutine, which answers offers and list
	// pages in order, off the dispatch goroutine (store checks run Nix).
	scoring chan scoreTask

	// mu guards what follows. Lock order (docs/LOCKS.md): ls.mu →
	// runningJob.mu, → the worker's slots.mu (assign) and → the
	// workersession.Session's mu (Stopping); no send under it.
	mu   sync.Mutex
	jobs map[string]*runningJob
	// credential is the deploy key of the next AssignJob (Credential).
	credential []byte
	drained    bool // the server sent Draining or Reject: request nothing more
	jobsDone   sync.WaitGroup
}

// Open is the job loop of one established session (workersession.Handler).
func (w *Worker) Open(s *workersession.Session) workersession.SessionHandler {
	cache := NewCacheClient(s.Send)
	cache.TempDir = w.cfg.TempDir
	cache.Moved = w.m.narMoved
	cache.Transferred = w.m.narTransferred
	cache.Overflowed = w.m.narPullOverflowed
	cache.Presigned, cache.PresignedMoved, cache.Log = w.m.presignedRequest, w.m.presignedMoved, w.log
	return &liveSession{w: w, s: s, jobs: map[string]*runningJob{}, cache: cache, scoring: make(chan scoreTask, 256),
		log: s.Log()}
}

// Start sends the rest of the session-start sequence (docs/protocol/jobs.md §2, docs/protocol/connection.md
// Server Restart), after the shell's WorkerCapabilities: RequestJobList,
// then one RequestJob per kind the worker can run, whether or not the
// kind has a free slot. After a reconnect the old session's aborted jobs
// may still hold their slots; the server must learn of the new session's
// kinds at once, not at the next heartbeat, and an AssignJob arriving
// while a slot is still busy is declined as usual.
func (ls *liveSession) Start() {
	go ls.scorer()
	ls.send(&wire.RequestJobList{})
	for _, kind := range jobKinds {
		if ls.canRun(kind) {
			ls.send(&wire.RequestJob{Kind: kind})
		}
	}
}

// Tick is the heartbeat's capacity-gated RequestJobs (§12.1), after the
// shell's WorkerMetrics.
func (ls *liveSession) Tick() { ls.requestFreeSlots() }

// Ended cancels every running job: nobody is left to report to.
func (ls *liveSession) Ended(string) { ls.abortAll(errSessionLost) }

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
	return !ls.quiet() && kindEnabled(ls.s.Capabilities(), kind) && ls.w.cfg.Executor != nil
}

// quiet: the server or the worker is draining.
func (ls *liveSession) quiet() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.drained || ls.s.Stopping()
}

func (ls *liveSession) send(m wire.ClientMessage) {
	if err := ls.s.Send(m); err != nil {
		ls.log.Debug("send failed", "message", m.WireName(), "error", err)
	}
}

// Handle takes one server message of the session: the cache client's
// answers and frames, and the job loop's messages.
func (ls *liveSession) Handle(m wire.ServerMessage) {
	if ls.cache.HandleMessage(m) {
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
	case *wire.ServerDraining, *wire.ServerReject:
		ls.markDrained() // logged by the shell
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

// markDrained stops requests and closes the session once no job is left.
func (ls *liveSession) markDrained() {
	ls.mu.Lock()
	ls.drained = true
	idle := len(ls.jobs) == 0
	ls.mu.Unlock()
	if idle {
		ls.s.Close(session.CloseNormal, "server draining")
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
	case ls.drained || ls.s.Stopping():
		reason = "worker is draining"
	case ls.w.cfg.Executor == nil:
		reason = "worker has no job executor"
	case !kindEnabled(ls.s.Capabilities(), kind):
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

// Stop is the worker's stop sequence on this session (docs/protocol/jobs.md §12.3),
// after the shell's ClientDraining: running jobs may finish within the
// drain budget; then cancel what is left so each reports Canceled and
// wait a bounded time for the reports. The shell then closes the session
// (letting queued messages out).
func (ls *liveSession) Stop() {
	running := ls.runningJobs()
	reported := make(chan struct{})
	go func() {
		ls.jobsDone.Wait()
		close(reported)
	}()
	if running > 0 && ls.w.cfg.DrainTimeout > 0 && ls.drain(running, reported) {
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
	case <-ls.s.Done():
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
