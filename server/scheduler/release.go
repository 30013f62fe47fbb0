package scheduler

import (
	"context"
	"errors"

	"gradient.dev/gradient/storage"
)

// A release that fails (a database error) leaves the job assigned in the
// database under an assignment no session holds: no pass reads it as
// pending and nothing reports on it, so without another try it would
// wait for the next server start (jobqueue.RecoverInterruptedWork). The
// scheduler keeps such assignments in s.unreleased and tries each again
// on every pass until the database takes it; both releases are
// idempotent (an assignment closed already is left as it is), so a
// release whose commit succeeded but reported an error is harmless to
// repeat.

// owedRelease is an assignment whose release the database refused.
type owedRelease struct {
	a *assignment
	// outcome is the assignment's outcome; jobqueue.OutcomeWorkerLost
	// with lost set releases it through ReleaseLostAssignment (the
	// job's lost-worker count grows).
	outcome string
	lost    bool
}

// release closes a's assignment with outcome and returns its job to the
// queue, or, if the database refuses, keeps it for the next pass.
// Called without s.mu held (it takes s.mu and waits on the database).
func (s *Scheduler) release(ctx context.Context, a *assignment, outcome string) {
	if err := s.queue.ReleaseAssignment(ctx, a.id, outcome); err != nil {
		s.owe(owedRelease{a: a, outcome: outcome}, err)
		return
	}
	s.addPending(ctx, []string{a.job.JobID})
	s.dispatch([]string{a.job.JobID})
}

// owe keeps a release the database refused for the next pass, logs it
// and counts it. An assignment the database no longer has went with its
// job (deleted meanwhile): there is nothing to return. Takes s.mu.
func (s *Scheduler) owe(r owedRelease, err error) {
	if errors.Is(err, storage.ErrNotFound) {
		s.log.Debug("the assignment to release is gone with its job", "job", r.a.job.JobID, "assignment", r.a.id)
		return
	}
	s.m.releaseFailures.Inc()
	s.log.Warn("returning a job to the queue failed; retrying on the next pass",
		"job", r.a.job.JobID, "assignment", r.a.id, "outcome", r.outcome, "error", err)
	s.mu.Lock()
	s.unreleased[r.a.id] = r
	s.mu.Unlock()
}

// retryReleases tries again every release the database refused, and
// queues the jobs it now takes. Runs on the periodic pass, without s.mu
// held.
func (s *Scheduler) retryReleases(ctx context.Context) {
	s.mu.Lock()
	owed := make([]owedRelease, 0, len(s.unreleased))
	for _, r := range s.unreleased {
		owed = append(owed, r)
	}
	s.mu.Unlock()
	var ids []string
	for _, r := range owed {
		var failed bool
		var err error
		if r.lost {
			failed, err = s.queue.ReleaseLostAssignment(ctx, r.a.id, s.cfg.MaxLostWorkers)
		} else {
			err = s.queue.ReleaseAssignment(ctx, r.a.id, r.outcome)
		}
		if err != nil && !errors.Is(err, storage.ErrNotFound) {
			if ctx.Err() == nil {
				s.m.releaseFailures.Inc()
				s.log.Warn("returning a job to the queue failed again; retrying on the next pass",
					"job", r.a.job.JobID, "assignment", r.a.id, "error", err)
			}
			continue
		}
		s.mu.Lock()
		delete(s.unreleased, r.a.id)
		s.mu.Unlock()
		if err != nil {
			continue // gone with its job
		}
		if failed {
			s.lostTooOften(ctx, r.a, r.a.workerID)
			continue
		}
		s.log.Info("returned a job to the queue after a failed release", "job", r.a.job.JobID, "assignment", r.a.id)
		ids = append(ids, r.a.job.JobID)
	}
	s.addPending(ctx, ids)
}

// lostTooOften records a job ReleaseLostAssignment failed for good.
func (s *Scheduler) lostTooOften(ctx context.Context, a *assignment, workerID string) {
	s.m.finished.WithLabelValues("lost").Inc()
	s.log.Warn("job failed: too many workers were lost while running it", "job", a.job.JobID, "what", describe(a.job),
		"lost_workers", s.cfg.MaxLostWorkers, "worker", workerID)
	if a.job.Kind == storage.JobBuild && s.importsPending(a.job.EvaluationID) {
		s.answerImports(ctx, a.job.EvaluationID)
	}
}
