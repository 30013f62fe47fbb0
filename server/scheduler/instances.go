package scheduler

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// Several server instances share the job queue (README "Several
// instances", docs/protocol/jobs.md §12.6): each assignment names the
// instance whose job loop opened it (Config.InstanceID). Start recovers
// only this instance's previous run, the ownerless assignments and dead
// instances' (jobqueue.RecoverInterruptedWork); every pass re-queues the
// work of instances that died since (recoverDeadInstances), and drops the
// assignments another instance recovered from this one while it was
// taken for dead (dropRecoveredAssignments).

// recoveryMetrics are the series of the recovery of dead instances.
type recoveryMetrics struct {
	instances prometheus.Counter // dead instances whose work this one re-queued
	jobs      prometheus.Counter // their jobs
	dropped   prometheus.Counter // own assignments another instance recovered
}

func newRecoveryMetrics(r prometheus.Registerer) *recoveryMetrics {
	m := &recoveryMetrics{
		instances: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_scheduler_instances_lost_total",
			Help: "Dead server instances (row gone or lease passed) whose running jobs this instance queued again.",
		}),
		jobs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_scheduler_instance_lost_jobs_total",
			Help: "Jobs of dead server instances this instance queued again.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_scheduler_assignments_taken_over_total",
			Help: "Running jobs of this instance that another instance queued again while this one was taken for dead (lease passed); their workers are told to abort.",
		}),
	}
	r.MustRegister(m.instances, m.jobs, m.dropped)
	return m
}

// recoverDeadInstances re-queues the running jobs of dead instances
// (jobqueue.RecoverDeadInstances: exactly once across the instances
// running it) and hands them to this instance's workers. Runs on the
// periodic pass; one cheap read when no instance holding work is dead.
func (s *Scheduler) recoverDeadInstances(ctx context.Context) {
	lost, err := s.queue.RecoverDeadInstances(ctx)
	if err != nil && ctx.Err() == nil {
		s.log.Warn("re-queueing the jobs of dead server instances failed; retrying on the next pass", "error", err)
	}
	var ids []string
	for _, l := range lost {
		s.rm.instances.Inc()
		s.rm.jobs.Add(float64(len(l.Jobs)))
		s.log.Warn("server instance lost: its running jobs are queued again", "lost_instance", l.ID, "jobs", len(l.Jobs))
		ids = append(ids, l.Jobs...)
	}
	if len(lost) == 0 {
		return
	}
	// It may have died between a build's commit and its dependents'
	// readying.
	s.strandedCheck.Store(true)
	s.addPending(ctx, ids)
	s.dispatch(ids)
}

// dropRecoveredAssignments finds the running assignments of this job loop
// that another instance closed and re-queued (this instance's lease had
// passed: it was paused, or lost the database, for longer than
// --instance-lease), forgets them and tells their workers to abort: the
// jobs run elsewhere now, and these workers' reports would be refused
// anyway (the assignments are closed). A job loop without an instance ID
// has no such assignments (ownerless ones are recovered only at start).
func (s *Scheduler) dropRecoveredAssignments(ctx context.Context) {
	if s.cfg.InstanceID == "" {
		return
	}
	s.mu.Lock()
	ids := make([]string, 0, len(s.jobs.running))
	for _, a := range s.jobs.running {
		ids = append(ids, a.id)
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	gone, err := s.queue.RecoveredAssignments(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("checking for running jobs recovered by another instance failed", "error", err)
		}
		return
	}
	if len(gone) == 0 {
		return
	}
	n, _ := s.abortHeld(gone, "the server instance was taken for dead; the job runs elsewhere") // its own: no note
	s.rm.dropped.Add(float64(n))
	s.log.Error("this instance was taken for dead (its lease passed): another instance queued its running jobs again; their workers abort",
		"instance", s.cfg.InstanceID, "jobs", len(gone), "aborted", n)
}
