package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// runningJob is an accepted job whose executor runs.
type runningJob struct {
	assignment Assignment
	ctx        context.Context
	cancel     context.CancelCauseFunc
	started    time.Time

	mu           sync.Mutex
	assignmentID string
}

func newRunningJob(a Assignment, assignmentID string) *runningJob {
	// Jobs outlive no session, but the session's context is the worker's
	// stop signal, which must reach jobs only through the stop sequence.
	ctx, cancel := context.WithCancelCause(context.Background())
	return &runningJob{assignment: a, ctx: ctx, cancel: cancel, started: time.Now(), assignmentID: assignmentID}
}

func (j *runningJob) setAssignmentID(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.assignmentID = id
}

func (j *runningJob) currentAssignmentID() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.assignmentID
}

// runJob runs the executor and reports the outcome, then frees the slot
// and asks for the next job of the kind.
func (ls *liveSession) runJob(j *runningJob) {
	defer ls.jobsDone.Done()
	a := j.assignment
	err := ls.w.cfg.Executor.Run(j.ctx, a, &jobReporter{ls: ls, job: j})
	cause := context.Cause(j.ctx)
	j.cancel(nil)

	ls.mu.Lock()
	delete(ls.jobs, a.JobID)
	idleAfterDrain := ls.drained && len(ls.jobs) == 0
	ls.mu.Unlock()
	ls.w.slots.release(a.Kind)
	kind := kindName(a.Kind)
	ran := time.Since(j.started)
	ls.w.m.jobsRunning.WithLabelValues(kind).Dec()
	ls.w.m.jobSeconds.WithLabelValues(kind).Add(ran.Seconds())

	elapsed := uint64(ran.Milliseconds())
	aid := j.currentAssignmentID()
	log := ls.log.With("job", a.JobID, "assignment", aid)
	switch {
	case errors.Is(cause, errSessionLost):
		// Nobody to report to: the server re-queues the job.
		log.Info("job cancelled: session lost")
		ls.w.m.jobEnded(kind, "session lost", ran)
	case err == nil:
		log.Info("job completed", "elapsed_ms", elapsed)
		ls.w.m.jobEnded(kind, "completed", ran)
		ls.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: aid, Spans: []wire.JobPhaseSpan{}, ElapsedMS: elapsed})
	default:
		failure, missing := failureKind(cause, err)
		msg := err.Error()
		if cause != nil {
			msg = cause.Error()
		}
		log.Info("job failed", "kind", failure, "error", msg, "elapsed_ms", elapsed)
		ls.w.m.jobEnded(kind, failure.String(), ran)
		ls.send(&wire.JobFailed{JobID: a.JobID, AssignmentID: aid, Error: msg, Kind: failure,
			MissingPaths: nonNil(missing), Spans: []wire.JobPhaseSpan{}, ElapsedMS: elapsed})
	}
	if idleAfterDrain {
		ls.s.Close(session.CloseNormal, "server draining")
		return
	}
	ls.requestIfFree(a.Kind)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// jobReporter binds a job's reports to its (job_id, assignment_id).
type jobReporter struct {
	ls  *liveSession
	job *runningJob
}

func (r *jobReporter) Update(u wire.JobUpdateKind) error {
	return r.ls.s.Send(&wire.JobUpdate{JobID: r.job.assignment.JobID, AssignmentID: r.job.currentAssignmentID(), Update: u})
}

func (r *jobReporter) Log(taskIndex uint32, data []byte) error {
	return r.ls.s.Send(&wire.LogChunk{JobID: r.job.assignment.JobID, TaskIndex: taskIndex, Data: data})
}

func (r *jobReporter) BuildProgress(p wire.BuildProgress) error {
	p.JobID, p.AssignmentID = r.job.assignment.JobID, r.job.currentAssignmentID()
	return r.ls.s.Send(&p)
}

func (r *jobReporter) EvalProgress(p wire.EvalProgressState) error {
	return r.ls.s.Send(&wire.EvalProgress{JobID: r.job.assignment.JobID, AssignmentID: r.job.currentAssignmentID(), Progress: p})
}

func (r *jobReporter) Send(m wire.ClientMessage) error { return r.ls.s.Send(m) }

func (r *jobReporter) Cache() Cache { return r.ls.cache }
