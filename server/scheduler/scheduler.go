// Package scheduler is the server's durable job loop (docs/protocol/jobs.md): it hands
// the queued fetch/evaluate and build jobs of the database to the workers
// that ask for work and may run them, and turns the workers' reports into
// state changes of evaluations and builds.
//
// The queue lives in the database (storage): every claim, completion and
// failure is one transaction there, so a restart loses at most the work in
// flight, never a queued job. The scheduler keeps a copy of the pending
// jobs in memory so that picking one costs no query, and re-reads the
// database on every tick.
package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

// Config tunes the job loop; zero values take the defaults of docs/protocol/jobs.md.
type Config struct {
	// MaxAttempts bounds the runs of a job failing with a retryable kind
	// (build.maxAttempts, 3).
	MaxAttempts int
	// MaxLostWorkers fails a job for good once this many sessions in a
	// row ended while running it without a report (10, docs/protocol/jobs.md §12.4): a
	// build that crashes its worker does not go round the pool for ever.
	MaxLostWorkers int
	// DefaultTimeoutSecs and DefaultMaxSilentSecs apply to derivations
	// without their own timeout / maxSilent (build.defaultTimeoutSecs,
	// build.defaultMaxSilentSecs); nil is 14400 / 3600, and 0 (configured
	// or the derivation's own) means no limit.
	DefaultTimeoutSecs   *uint64
	DefaultMaxSilentSecs *uint64
	// Tick is how often the queue is re-read from the database and idle
	// workers are served again (5 s).
	Tick time.Duration
	// RetryBackoff delays the retry of a job that failed with a retryable
	// kind, doubling with each counted attempt (build.retryBackoffSecs,
	// 30 s). Negative retries at once.
	RetryBackoff time.Duration
	// HoldStreamedBuilds keeps an evaluation's builds waiting until its
	// flake job completes instead of queueing those whose inputs are all
	// built from each EvalResult batch (docs/protocol/jobs.md §9.1):
	// evaluation, then build. Off by default; for measurements
	// (docs/PERFORMANCE.md, issue 33). The worker sees no difference.
	HoldStreamedBuilds bool
	Logger             *slog.Logger
	// DeployKeys opens projects' SSH deploy keys (deploykeys.Keys),
	// sent to the worker that fetches the project; nil sends none.
	DeployKeys interface {
		Private(ctx context.Context, projectID string) ([]byte, error)
	}
	// Metrics receives the job loop's series (normally the server's
	// registry, Server.Metrics); nil keeps them in a private registry.
	Metrics prometheus.Registerer
	// InstanceID is this server instance's ID (server/instance; README
	// "Several instances"): the instance that owns the assignments this
	// job loop opens. "" is a job loop alone on its database (tests,
	// gradient up).
	InstanceID string
}

func (c *Config) defaults() {
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 3
	}
	if c.MaxLostWorkers <= 0 {
		c.MaxLostWorkers = 10
	}
	if c.DefaultTimeoutSecs == nil {
		c.DefaultTimeoutSecs = new(DefaultTimeoutSecs)
	}
	if c.DefaultMaxSilentSecs == nil {
		c.DefaultMaxSilentSecs = new(DefaultMaxSilentSecs)
	}
	if c.Tick <= 0 {
		c.Tick = 5 * time.Second
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
	}
}

// claimTries is how many candidates one request tries when claims lose
// races (docs/protocol/jobs.md §5.2).
const claimTries = 3

// Scheduler implements authority.JobLoop over the database's job queue.
type Scheduler struct {
	db    *storage.DB
	queue *jobqueue.Queue
	cfg   Config
	log   *slog.Logger
	m     *loopMetrics
	rm    *recoveryMetrics // instances.go

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// logsDone: the log buffer wrote its last lines.
	logsDone chan struct{}
	// strandedCheck: a completion failed part-way; the next pass readies
	// builds whose inputs are all built (jobqueue.ReadyStrandedBuilds).
	strandedCheck atomic.Bool

	logs *logBuffer
	// recording counts completions being recorded beside their sessions
	// (see HandleJobMessage); Close waits for them.
	recording sync.WaitGroup

	// mu guards what follows. Lock order (docs/LOCKS.md): s.mu → a
	// session's lock (LiveWorker's getters: take, newEligibility). No
	// database call and no send runs under it.
	mu sync.Mutex
	// jobs are the jobs the scheduler holds: queued, being claimed,
	// running, and the completions being recorded (jobstates.go).
	jobs     jobStates
	sessions map[uint64]*workerState
	// admitted, when set (tests), sees each chunk of an evaluation's
	// ready jobs after it joined the queue and was dispatched.
	admitted func(jobIDs []string)
	imports  []*importRequest // import-from-derivation requests waiting
	// progress is the latest BuildProgress of each running build, by
	// build ID (docs/protocol/jobs.md §9.2: kept 15 s, shown while building).
	progress map[string]buildProgress
	// unreleased are the assignments whose release the database refused,
	// by assignment ID: their jobs are assigned in the database and held
	// by no session; each pass tries again (see release.go).
	unreleased map[string]owedRelease

	// notes are what this job loop and other instances' tell each other
	// (notify.go).
	notes notes
}

type buildProgress struct {
	jobID string
	at    time.Time
	m     wire.BuildProgress
}

// workerState is what the scheduler knows of one live session.
type workerState struct {
	w *authority.LiveWorker
	// idle: the worker asked for a job of the kind and got none yet. The
	// server keeps no queue of requests, only this flag (docs/protocol/jobs.md §5.2).
	idle  [2]bool
	ended bool
	// scores are the worker's latest CandidateScores by job (docs/protocol/jobs.md §4;
	// not persisted: rebuilt from RequestJobList after a reconnect).
	scores map[string]wire.CandidateScore
	// offered are the pending jobs already offered to this session.
	offered map[string]bool
}

// assignment is a job handed to a session.
type assignment struct {
	id       string
	job      *storage.PendingJob
	session  uint64
	workerID string
	outputs  []storage.BuildOutputInfo
	// fetchOnly: a flake job split for an evaluating worker that may not
	// fetch; its completion queues the job again for the evaluation.
	fetchOnly bool
}

var _ authority.JobLoop = (*Scheduler)(nil)

// New returns a scheduler over db. Call Start before the server accepts
// sessions.
func New(db *storage.DB, cfg Config) *Scheduler {
	cfg.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Scheduler{
		db: db, queue: jobqueue.New(db, jobqueue.ForInstance(cfg.InstanceID)), cfg: cfg, log: cfg.Logger.With("component", "scheduler"),
		ctx: ctx, cancel: cancel, done: make(chan struct{}), logsDone: make(chan struct{}),
		jobs: newJobStates(), sessions: map[uint64]*workerState{}, progress: map[string]buildProgress{},
		unreleased: map[string]owedRelease{},
	}
	s.notes.listening, s.notes.sendWake, s.notes.recvWake = make(chan struct{}), make(chan struct{}, 1), make(chan struct{}, 1)
	s.logs = newLogBuffer(s)
	s.m = newLoopMetrics(cfg.Metrics, s.idleSessions)
	s.rm = newRecoveryMetrics(cfg.Metrics)
	return s
}

// idleSessions counts the live sessions that asked for a job of kind and
// have none yet.
func (s *Scheduler) idleSessions(kind wire.JobKind) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ws := range s.sessions {
		if !ws.ended && ws.idle[kind] {
			n++
		}
	}
	return n
}

// Start recovers the work a previous run left open (its assignments
// closed, running builds and evaluations queued again) — this instance's
// previous run's, the ownerless and dead instances' work, never a live
// instance's (instances.go) — loads the queue and starts the periodic
// pass. It must run before the first session.
func (s *Scheduler) Start(ctx context.Context) error {
	released, err := s.queue.RecoverInterruptedWork(ctx)
	if err != nil {
		return err
	}
	if released > 0 {
		s.log.Info("recovered interrupted work: re-queued jobs that were running", "jobs", released, "instance", s.cfg.InstanceID)
	}
	if err := s.reload(ctx); err != nil {
		return err
	}
	go s.loop()
	go func() {
		defer close(s.logsDone)
		s.logs.run(s.ctx)
	}()
	s.startNotes()
	return nil
}

// Close lets the completions being recorded finish, stops the periodic
// pass and writes out the buffered logs.
func (s *Scheduler) Close() {
	s.recording.Wait()
	s.cancel()
	s.notes.wg.Wait()
	select {
	case <-s.done:
		<-s.logsDone
	default:
		// Start never ran.
	}
}

func (s *Scheduler) loop() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.retryReleases(s.ctx)
		s.dropRecoveredAssignments(s.ctx)
		s.recoverDeadInstances(s.ctx)
		s.checkAlone(s.ctx)
		if err := s.reload(s.ctx); err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("reading the job queue failed", "error", err)
			}
			continue
		}
		if s.strandedCheck.Swap(false) {
			ready, err := s.queue.ReadyStrandedBuilds(s.ctx)
			if err != nil {
				s.strandedCheck.Store(true)
				s.log.Warn("readying stranded builds failed; retrying on the next pass", "error", err)
			} else if len(ready) > 0 {
				s.log.Info("readied builds a failed completion left waiting", "jobs", len(ready))
				s.addPending(s.ctx, ready)
			}
		}
		if n, err := s.queue.FinishDoneEvaluations(s.ctx); err != nil && s.ctx.Err() == nil {
			s.log.Warn("ending finished evaluations failed", "error", err)
		} else if n > 0 {
			s.log.Info("ended evaluations whose builds were all done", "evaluations", n)
		}
		s.dispatchAll()
	}
}

// reload brings the in-memory queue in line with the database's pending
// jobs: it reads their IDs, drops the queued jobs the database no longer
// has pending and reads in full only the jobs new to the queue, so a pass
// over a large queue costs one read of its IDs (not of every job, with
// its derivation's details, as the first version did).
func (s *Scheduler) reload(ctx context.Context) error {
	s.mu.Lock()
	mark := s.jobs.queue.seq
	s.mu.Unlock()
	ids, err := s.queue.PendingJobIDs(ctx)
	if err != nil {
		return err
	}
	pending := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		pending[id] = struct{}{}
	}
	s.mu.Lock()
	var unknown []string
	for _, id := range ids {
		if !s.jobs.known(id) {
			unknown = append(unknown, id)
		}
	}
	stale := s.jobs.queue.staleSince(mark, pending)
	for _, id := range stale {
		s.jobs.queue.remove(id)
	}
	s.m.pending.Set(float64(s.jobs.queue.len()))
	s.mu.Unlock()
	if len(stale) > 0 {
		s.log.Debug("dropped queued jobs the database no longer has pending", "jobs", len(stale))
	}
	if len(unknown) == 0 {
		return nil
	}
	jobs, err := s.queue.PendingJobsByID(ctx, unknown)
	if err != nil {
		return err
	}
	s.mu.Lock()
	var unread []string
	for i := range jobs {
		j := &jobs[i]
		// A job claimed in the meantime stays out.
		if s.jobs.enqueue(j) && j.Kind == storage.JobBuild {
			unread = append(unread, j.JobID)
		}
	}
	s.m.pending.Set(float64(s.jobs.queue.len()))
	s.mu.Unlock()
	s.reoffer(unread)
	s.fillRequiredPaths(unread)
	return nil
}

// addPending puts jobs the database made pending into the queue.
func (s *Scheduler) addPending(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	jobs, err := s.queue.PendingJobsByID(ctx, ids)
	if err != nil {
		s.log.Warn("reading newly ready jobs failed; the next pass picks them up", "error", err)
		return
	}
	s.mu.Lock()
	for i := range jobs {
		j := &jobs[i]
		s.jobs.enqueue(j)
	}
	s.m.pending.Set(float64(s.jobs.queue.len()))
	s.mu.Unlock()
	s.reoffer(ids)
	s.announce(ids)
}

// dispatch serves idle workers first, then offers the jobs of ids that
// are left.
func (s *Scheduler) dispatch(ids []string) {
	s.serveIdle()
	s.offer(ids, false)
}

// dispatchAll serves idle workers, then offers every pending job not
// offered yet (after the queue was read again).
func (s *Scheduler) dispatchAll() {
	s.serveIdle()
	s.offer(nil, true)
}

// SessionStarted implements authority.JobLoop.
func (s *Scheduler) SessionStarted(w *authority.LiveWorker) {
	s.mu.Lock()
	s.sessions[w.Session] = &workerState{w: w, scores: map[string]wire.CandidateScore{}, offered: map[string]bool{}}
	s.m.sessions.Set(float64(len(s.sessions)))
	s.mu.Unlock()
}

// SessionEnded implements authority.JobLoop: the session's jobs go back to
// the queue (the worker abandoned them with the session).
func (s *Scheduler) SessionEnded(w *authority.LiveWorker, reason string) {
	s.mu.Lock()
	if ws := s.sessions[w.Session]; ws != nil {
		ws.ended = true
	}
	delete(s.sessions, w.Session)
	s.m.sessions.Set(float64(len(s.sessions)))
	// Its import requests die with it: a new session evaluates again.
	s.imports = slices.DeleteFunc(s.imports, func(r *importRequest) bool { return r.w == w })
	lost := s.jobs.runningOn(w.Session)
	for _, a := range lost {
		s.untrack(a)
	}
	s.mu.Unlock()
	if len(lost) == 0 {
		return
	}
	ctx := s.ctx
	ids := make([]string, 0, len(lost))
	for _, a := range lost {
		failed, err := s.queue.ReleaseLostAssignment(ctx, a.id, s.cfg.MaxLostWorkers)
		if err != nil {
			s.owe(owedRelease{a: a, outcome: jobqueue.OutcomeWorkerLost, lost: true}, err)
			continue
		}
		if failed {
			s.lostTooOften(ctx, a, w.WorkerID)
			continue
		}
		ids = append(ids, a.job.JobID)
	}
	s.log.Info("worker lost: its jobs are queued again", "worker", w.WorkerID, "jobs", len(ids), "reason", reason)
	s.addPending(ctx, ids)
	s.dispatch(ids)
}

// HandleJobMessage implements authority.JobLoop.
func (s *Scheduler) HandleJobMessage(w *authority.LiveWorker, m wire.ClientMessage) {
	ctx := s.ctx
	switch m := m.(type) {
	case *wire.RequestJob:
		s.setIdle(w, m.Kind, true)
		s.serve(ctx, w)
	case *wire.WorkerCapabilities, *wire.ClientDraining:
		s.serve(ctx, w)
	case *wire.RequestJobList:
		s.sendJobList(w)
	case *wire.RequestJobChunk:
		s.keepScores(w, m.Scores)
	case *wire.AssignJobResponse:
		s.assignResponse(ctx, w, m)
	case *wire.JobUpdate:
		if a := s.owned(w, m.JobID, m.AssignmentID); a != nil {
			s.update(ctx, a, m.Update)
		}
	case *wire.LogChunk:
		if a := s.ownedJob(w, m.JobID); a != nil {
			s.logs.add(ctx, m.JobID, m.Data) // copies: the frame is not ours
		}
	case *wire.EvalMessage:
		if a := s.ownedJob(w, m.JobID); a != nil {
			line := "[" + evalLevel(m.Level) + "] " + m.Source + ": " + m.Message + "\n"
			s.logs.add(ctx, m.JobID, []byte(line))
			// An attribute that failed to evaluate fails the evaluation
			// (after its builds); a build's messages only explain it.
			if m.Level == wire.EvalLevelError && a.job.Kind == storage.JobFlake {
				if err := s.queue.AddEvaluationErrors(ctx, a.job.EvaluationID, []string{m.Source + ": " + m.Message}); err != nil {
					s.log.Warn("recording an evaluation error failed", "job", m.JobID, "error", err)
				}
			}
		}
	case *wire.JobCompleted:
		a := s.owned(w, m.JobID, m.AssignmentID)
		switch {
		case a == nil:
		case a.job.Kind == storage.JobBuild && s.queue.ParallelCompletions():
			// A build is recorded beside the session, so the worker's
			// next RequestJob is served while the completion commits:
			// its turnaround is then the longer of the two statements,
			// not their sum. The assignment is forgotten first, so a
			// repeated report is dropped.
			s.forget(a)
			s.recording.Go(func() { s.completed(ctx, a) })
		default:
			s.completed(ctx, a)
		}
	case *wire.JobFailed:
		if a := s.owned(w, m.JobID, m.AssignmentID); a != nil {
			s.failed(ctx, a, m)
		}
	case *wire.ImportRequest:
		if a := s.ownedJob(w, m.JobID); a != nil {
			s.importRequest(ctx, w, a, m)
		} else {
			w.Send(authority.RefuseImport(m)) // never left waiting
		}
	case *wire.BuildProgress:
		if a := s.owned(w, m.JobID, m.AssignmentID); a != nil {
			s.keepProgress(a, m)
		}
	case *wire.EvalProgress:
		// Only the evaluation's status is shown; nothing to keep.
	}
}

func (s *Scheduler) setIdle(w *authority.LiveWorker, kind wire.JobKind, idle bool) {
	if int(kind) >= 2 {
		return
	}
	s.mu.Lock()
	if ws := s.sessions[w.Session]; ws != nil {
		ws.idle[kind] = idle
	}
	s.mu.Unlock()
}

// owned returns the assignment of jobID if this session holds it under
// assignmentID: a report carrying an assignment ID counts only with the
// one this session handed out, so an empty one never does. Reports for
// anything else are dropped (docs/protocol/connection.md Server Restart, docs/protocol/jobs.md
// §17.6).
func (s *Scheduler) owned(w *authority.LiveWorker, jobID, assignmentID string) *assignment {
	return s.held(w, jobID, func(a *assignment) bool { return a.id == assignmentID })
}

// ownedJob is owned for the messages that carry no assignment ID (log
// lines, eval messages, declines, imports): the session must hold jobID.
func (s *Scheduler) ownedJob(w *authority.LiveWorker, jobID string) *assignment {
	return s.held(w, jobID, func(*assignment) bool { return true })
}

func (s *Scheduler) held(w *authority.LiveWorker, jobID string, match func(*assignment) bool) *assignment {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.jobs.assignment(jobID)
	if a == nil || a.session != w.Session || !match(a) {
		s.m.dropped.Inc()
		return nil
	}
	return a
}

// serveIdle offers work to every session with an idle slot.
func (s *Scheduler) serveIdle() {
	s.mu.Lock()
	var idle []*authority.LiveWorker
	for _, ws := range s.sessions {
		if ws.idle[0] || ws.idle[1] {
			idle = append(idle, ws.w)
		}
	}
	s.mu.Unlock()
	// Oldest sessions first, so assignment order is stable.
	slices.SortFunc(idle, func(a, b *authority.LiveWorker) int { return int(a.Session - b.Session) })
	for _, w := range idle {
		s.serve(s.ctx, w)
	}
}

// serve assigns a job of every idle kind of w, if one is eligible.
func (s *Scheduler) serve(ctx context.Context, w *authority.LiveWorker) {
	for _, kind := range []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild} {
		s.serveKind(ctx, w, kind)
	}
}

func (s *Scheduler) serveKind(ctx context.Context, w *authority.LiveWorker, kind wire.JobKind) {
	for range s.claimTries() {
		job, fetchOnly := s.take(w, kind)
		if job == nil {
			return
		}
		start := time.Now()
		id, err := s.queue.ClaimJob(ctx, job.JobID, w.WorkerID)
		if err != nil {
			s.mu.Lock()
			// A job lost to a race is gone; any other failure keeps it
			// and the next pass retries.
			lostRace := errors.Is(err, storage.ErrConflict) || errors.Is(err, storage.ErrNotFound)
			s.jobs.unclaim(job, !lostRace)
			if ws := s.sessions[w.Session]; ws != nil && !ws.ended {
				ws.idle[kind] = true
			}
			if !lostRace {
				s.mu.Unlock()
				s.log.Warn("claiming a job failed", "job", job.JobID, "error", err)
				return
			}
			s.mu.Unlock()
			s.m.claimsLost.Inc()
			if job.Kind == storage.JobBuild {
				s.endIfLast(ctx, job.EvaluationID) // it may have held the end back
			}
			continue // lost a race: the job is gone, try the next one
		}
		a := &assignment{id: id, job: job, session: w.Session, workerID: w.WorkerID, fetchOnly: fetchOnly}
		s.mu.Lock()
		ws := s.sessions[w.Session]
		if ws == nil || ws.ended {
			s.jobs.unclaim(job, false)
			s.mu.Unlock()
			// The session ended while claiming: give the job back.
			s.release(ctx, a, jobqueue.OutcomeWorkerLost)
			return
		}
		s.jobs.run(a)
		s.mu.Unlock()
		s.m.assigned.Inc()
		s.m.claimSeconds.Observe(time.Since(start).Seconds())
		s.m.dispatchLatency.WithLabelValues(string(job.Kind)).Observe(time.Since(job.ReadyAt).Seconds())
		m := s.assignJob(job, id, fetchOnly)
		s.log.Info("assigned job", "job", job.JobID, "kind", job.Kind, "worker", w.WorkerID, "assignment", id, "what", describe(job), "steps", steps(m))
		if cred := s.credential(ctx, job, m); cred != nil {
			w.Send(cred) // just before the AssignJob that needs it
		}
		if err := w.Send(m); err != nil {
			// The session is going; SessionEnded re-queues the job.
			s.log.Debug("sending AssignJob failed", "job", job.JobID, "error", err)
		}
		return
	}
}

// take removes from the queue the first job of kind w may run, and
// clears w's idle flag for the kind. fetchOnly says that w gets only the
// fetch step of a flake job (see splitFetch). Takes s.mu, and under it
// w's session lock (LiveWorker.Draining, newEligibility).
func (s *Scheduler) take(w *authority.LiveWorker, kind wire.JobKind) (job *storage.PendingJob, fetchOnly bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.sessions[w.Session]
	if ws == nil || ws.ended || !ws.idle[kind] || w.Draining() {
		return nil, false
	}
	e := newEligibility(w)
	now := time.Now()
	var best *storage.PendingJob
	var bestRank jobRank
	seen := 0
	consider := func(job *storage.PendingJob) bool {
		if s.backingOff(job, now) {
			return true
		}
		if r := rank(ws.scores, job.JobID); best == nil || r.better(bestRank) {
			best, bestRank = job, r
		}
		seen++
		return bestRank.class > 0 && seen < scoreWindow
	}
	s.jobs.queue.eachIn(func(g *jobGroup) bool { return !g.key.foreign && e.may(g.sample, kind) }, consider)
	if best == nil {
		// Only then the jobs other instances told of, newest first: their
		// own workers take them oldest first (notify.go).
		s.jobs.queue.eachNewest(func(g *jobGroup) bool { return g.key.foreign && e.may(g.sample, kind) }, consider)
	}
	if best == nil {
		return nil, false
	}
	job = s.jobs.take(best.JobID)
	for _, other := range s.sessions {
		delete(other.offered, job.JobID) // frees room in their offer windows
	}
	ws.idle[kind] = false
	s.m.pending.Set(float64(s.jobs.queue.len()))
	return job, s.splitFetch(job, e, w.Session)
}

// splitFetch reports whether a fetching worker gets only the fetch step
// of a flake job (docs/protocol/jobs.md §6, flake-job splitting): when it may not
// evaluate the project, or when an idle worker that may evaluate but not
// fetch is waiting for work, which then evaluates the fetched source.
// Otherwise one job carries fetch and evaluation. Called with s.mu held.
func (s *Scheduler) splitFetch(job *storage.PendingJob, taker eligibility, session uint64) bool {
	if job.Kind != storage.JobFlake || job.FlakeSource != "" {
		return false
	}
	if !taker.mayEvaluate(job.ProjectID) {
		return true
	}
	for id, other := range s.sessions {
		if id == session || other.ended || !other.idle[wire.JobKindFlake] {
			continue
		}
		if e := newEligibility(other.w); e.mayEvaluate(job.ProjectID) && !e.mayFetch(job.ProjectID) {
			return true
		}
	}
	return false
}

// scoreWindow is how many of the oldest eligible jobs a pick compares by
// the worker's scores: enough to prefer a job whose inputs the worker
// holds, few enough to keep the queue's order.
const scoreWindow = 32

// jobRank orders jobs for one worker by its scores: outputs already
// present (upload only), then nothing to download, then the least to
// download (missing NAR bytes, then paths); unscored jobs last. Ties keep
// the queue's order (oldest ready first).
type jobRank struct {
	class        int
	missingBytes uint64
	missingPaths uint64
}

func (r jobRank) better(than jobRank) bool {
	if r.class != than.class {
		return r.class < than.class
	}
	if r.missingBytes != than.missingBytes {
		return r.missingBytes < than.missingBytes
	}
	return r.missingPaths < than.missingPaths
}

func rank(scores map[string]wire.CandidateScore, jobID string) jobRank {
	sc, ok := scores[jobID]
	switch {
	case !ok:
		return jobRank{class: 3}
	case sc.OutputsPresent:
		return jobRank{class: 0}
	case sc.MissingCount == 0:
		return jobRank{class: 1}
	}
	return jobRank{class: 2, missingBytes: sc.MissingNarSize, missingPaths: uint64(sc.MissingCount)}
}

// keepScores records a worker's scores.
func (s *Scheduler) keepScores(w *authority.LiveWorker, scores []wire.CandidateScore) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.sessions[w.Session]
	if ws == nil {
		return
	}
	if len(ws.scores) > maxScoresPerSession {
		clear(ws.scores) // stale entries of long-gone jobs
	}
	for _, sc := range scores {
		ws.scores[sc.JobID] = sc
	}
}

const maxScoresPerSession = 100_000

// backingOff: job failed before and waits before its retry. Called with
// s.mu held (job is the queue's).
func (s *Scheduler) backingOff(job *storage.PendingJob, now time.Time) bool {
	if job.Attempts == 0 || s.cfg.RetryBackoff < 0 {
		return false
	}
	wait := s.cfg.RetryBackoff << min(job.Attempts-1, 10)
	return now.Sub(job.ReadyAt) < wait
}

// assignJob is the AssignJob of a claimed job. A flake job carries every
// step; a fetch-only one the fetch step; one whose source is fetched
// already the evaluation steps, from the cached source.
func (s *Scheduler) assignJob(job *storage.PendingJob, assignmentID string, fetchOnly bool) *wire.AssignJob {
	if job.Kind == storage.JobFlake {
		wildcards := job.Wildcards
		if wildcards == nil {
			wildcards = []string{}
		}
		flake := &wire.FlakeJob{
			Steps:          []wire.FlakeStep{wire.FlakeStepFetchFlake, wire.FlakeStepEvaluateFlake, wire.FlakeStepEvaluateDerivations},
			Source:         &wire.FlakeSourceRepository{URL: job.RepositoryURL, Commit: job.Commit},
			Wildcards:      wildcards,
			InputOverrides: []wire.FlakeInputOverride{},
		}
		switch {
		case job.FlakeSource != "":
			flake.Steps = flake.Steps[1:]
			flake.Source = &wire.FlakeSourceCached{StorePath: job.FlakeSource}
		case fetchOnly:
			flake.Steps = flake.Steps[:1]
		}
		return &wire.AssignJob{JobID: job.JobID, AssignmentID: assignmentID, Job: flake}
	}
	features := job.RequiredFeatures
	if features == nil {
		features = []string{}
	}
	return &wire.AssignJob{JobID: job.JobID, AssignmentID: assignmentID, Job: &wire.BuildJob{
		Builds: []wire.BuildSpec{{
			BuildID: job.BuildID, DrvPath: job.DrvPath, Kind: wire.BuildSpecBuild, IsFixedOutput: job.IsFixedOutput,
			Outputs:     []wire.DerivationOutput{},
			TimeoutSecs: limit(job.TimeoutSecs, *s.cfg.DefaultTimeoutSecs), MaxSilentSecs: limit(job.MaxSilentSecs, *s.cfg.DefaultMaxSilentSecs),
		}},
		Requirement: wire.BuildRequirement{Architecture: job.Architecture, RequiredFeatures: features},
	}}
}

// The build limits' defaults (build.defaultTimeoutSecs,
// build.defaultMaxSilentSecs).
const (
	DefaultTimeoutSecs   uint64 = 14400
	DefaultMaxSilentSecs uint64 = 3600
)

// limit is a derivation's own limit, else the default. A resulting 0 is
// no limit and goes out as none (docs/protocol/jobs.md §8.2: the reference sends None),
// which every worker reads as unlimited.
func limit(own *uint64, def uint64) *uint64 {
	v := def
	if own != nil {
		v = *own
	}
	if v == 0 {
		return nil
	}
	return &v
}

// credential is the project's deploy key for an AssignJob with a fetch
// step (docs/protocol/jobs.md §5.2), or nil: no fetch, no key, or the key does not open
// (then the fetch of a private repository fails on the worker, and the
// log here says why).
func (s *Scheduler) credential(ctx context.Context, job *storage.PendingJob, m *wire.AssignJob) *wire.Credential {
	flake, ok := m.Job.(*wire.FlakeJob)
	if !ok || s.cfg.DeployKeys == nil || !slices.Contains(flake.Steps, wire.FlakeStepFetchFlake) {
		return nil
	}
	key, err := s.cfg.DeployKeys.Private(ctx, job.ProjectID)
	if err != nil {
		s.log.Warn("the project's deploy key is not sent with its fetch", "job", job.JobID, "project", job.ProjectID, "error", err)
		return nil
	}
	if key == nil {
		return nil
	}
	return &wire.Credential{Kind: wire.CredentialSSHKey, Data: key}
}

// steps names the steps of an assigned flake job, for the log.
func steps(m *wire.AssignJob) string {
	flake, ok := m.Job.(*wire.FlakeJob)
	if !ok {
		return "build"
	}
	names := make([]string, len(flake.Steps))
	for i, st := range flake.Steps {
		names[i] = st.String()
	}
	return strings.Join(names, ", ")
}

func describe(job *storage.PendingJob) string {
	if job.Kind == storage.JobFlake {
		return job.RepositoryURL + "@" + job.Commit
	}
	if job.Attr != "" {
		return job.Attr
	}
	return job.DrvPath
}

func evalLevel(l wire.EvalMessageLevel) string {
	switch l {
	case wire.EvalLevelError:
		return "error"
	case wire.EvalLevelWarning:
		return "warning"
	}
	return "notice"
}

// StartEvaluation queues an evaluation of a project's flake at a commit
// and hands its flake job to an idle worker at once.
func (s *Scheduler) StartEvaluation(ctx context.Context, in storage.NewEvaluation) (storage.Evaluation, error) {
	ev, err := s.queue.CreateEvaluation(ctx, in)
	if err != nil {
		return ev, err
	}
	s.log.Info("evaluation queued", "evaluation", ev.ID, "project", ev.ProjectID, "repository", ev.RepositoryURL, "commit", ev.Commit)
	if err := s.reload(ctx); err != nil {
		s.log.Warn("reading the job queue failed; the next pass picks the evaluation up", "error", err)
	}
	s.dispatchAll()
	s.announceEvaluation(ev.ID)
	return ev, nil
}

// ApproveEvaluation lets a pull request's evaluation that waits for
// approval run: its flake job is queued and handed out at once.
func (s *Scheduler) ApproveEvaluation(ctx context.Context, evalID string) error {
	if err := s.queue.ApproveEvaluation(ctx, evalID); err != nil {
		return err
	}
	s.log.Info("evaluation approved", "evaluation", evalID)
	if err := s.reload(ctx); err != nil {
		s.log.Warn("reading the job queue failed; the next pass picks the evaluation up", "error", err)
	}
	s.dispatchAll()
	s.announceEvaluation(evalID)
	return nil
}

// CancelEvaluation cancels an evaluation: its queued jobs are dropped and
// the workers running its jobs get AbortJob.
func (s *Scheduler) CancelEvaluation(ctx context.Context, evalID string) error {
	open, err := s.queue.CancelEvaluation(ctx, evalID)
	if err != nil {
		return err
	}
	aborted := s.abortOpen(open, "evaluation cancelled")
	s.log.Info("evaluation cancelled", "evaluation", evalID, "aborted_jobs", aborted)
	return s.reload(ctx)
}

// abortOpen forgets the assignments the database just closed (open) and
// sends their workers AbortJob with reason; it returns how many it told.
// Those no session of this instance holds go to the other instances
// (notify.go), whose sessions may hold them.
func (s *Scheduler) abortOpen(open []storage.OpenAssignment, reason string) int {
	told, elsewhere := s.abortHeld(open, reason)
	s.announceAborts(elsewhere, reason)
	return told
}

// abortHeld is abortOpen for the assignments this instance holds; it
// returns the others.
func (s *Scheduler) abortHeld(open []storage.OpenAssignment, reason string) (told int, elsewhere []storage.OpenAssignment) {
	s.mu.Lock()
	type abort struct {
		w     *authority.LiveWorker
		jobID string
	}
	var aborts []abort
	for _, o := range open {
		a := s.jobs.assignment(o.JobID)
		if a == nil || a.id != o.AssignmentID {
			elsewhere = append(elsewhere, o)
			continue
		}
		s.untrack(a)
		if ws := s.sessions[a.session]; ws != nil {
			aborts = append(aborts, abort{ws.w, o.JobID})
		}
	}
	s.mu.Unlock()
	for _, ab := range aborts {
		ab.w.Send(&wire.AbortJob{JobID: ab.jobID, Reason: reason})
	}
	return len(aborts), elsewhere
}

// RestartFailedBuilds runs an evaluation's failed builds again
// (jobqueue.RestartFailedBuilds) and queues them like any ready build:
// those whose outputs the project's caches hold meanwhile are marked
// built instead of rebuilt. It returns how many builds restarted.
func (s *Scheduler) RestartFailedBuilds(ctx context.Context, evalID string) (int, error) {
	jobs, err := s.queue.RestartFailedBuilds(ctx, evalID)
	if err != nil {
		return 0, err
	}
	ev, err := s.queue.Evaluation(ctx, evalID)
	if err != nil {
		return len(jobs), err
	}
	s.log.Info("failed builds restarted", "evaluation", evalID, "builds", len(jobs))
	s.admit(ctx, evalID, s.projectCaches(ctx, ev.ProjectID), jobs)
	s.endIfLast(ctx, evalID) // all of them cached meanwhile
	return len(jobs), nil
}
