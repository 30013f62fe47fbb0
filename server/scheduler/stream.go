package scheduler

import (
	"context"

	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

// streamBuilds queues the builds of an EvalResult batch whose inputs are
// all built, while the evaluation goes on (docs/protocol/jobs.md §9.1):
// the first builds start before a large evaluation ends. Those the
// project's caches hold already are marked built instead (admit). A
// failure only delays them to the evaluation's end.
//
// Config.HoldStreamedBuilds turns this off: the builds wait for the
// evaluation's end.
func (s *Scheduler) streamBuilds(ctx context.Context, a *assignment, drvs []wire.DiscoveredDerivation) {
	if s.cfg.HoldStreamedBuilds {
		return
	}
	paths := make([]string, len(drvs))
	for i, d := range drvs {
		paths[i] = d.DrvPath
	}
	// In chunks, as at the evaluation's end (jobqueue.ReadyChunk): each
	// chunk's builds are assignable once its transaction commits, before
	// a large batch's later ones are queued.
	caches := s.projectCaches(ctx, a.job.ProjectID)
	for len(paths) > 0 {
		n := min(len(paths), jobqueue.ReadyChunk)
		ready, err := s.queue.QueueStreamedBuilds(ctx, a.job.EvaluationID, paths[:n])
		paths = paths[n:]
		if err != nil {
			s.log.Warn("queueing an evaluation's first builds failed; they wait for its end", "evaluation", a.job.EvaluationID, "error", err)
			return
		}
		if len(ready) == 0 {
			continue
		}
		admitted := s.admit(ctx, a.job.EvaluationID, caches, ready)
		s.log.Debug("builds queued while evaluating", "evaluation", a.job.EvaluationID, "jobs", admitted)
	}
}

// stopStreamedBuilds ends the builds an evaluation streamed when its
// flake job failed for good: the workers running them get AbortJob.
func (s *Scheduler) stopStreamedBuilds(ctx context.Context, evalID string) {
	open, stopped, err := s.queue.StopEvaluationBuilds(ctx, evalID)
	if err != nil {
		s.log.Warn("stopping a failed evaluation's builds failed", "evaluation", evalID, "error", err)
		return
	}
	aborted := s.abortOpen(open, "evaluation failed")
	if stopped == 0 {
		return
	}
	s.log.Info("a failed evaluation's builds stopped", "evaluation", evalID, "jobs", stopped, "aborted_jobs", aborted)
	if err := s.reload(ctx); err != nil { // drops its queued jobs
		s.log.Warn("reading the job queue failed", "error", err)
	}
}
