package scheduler

import "gradient.dev/gradient/metrics"

// loopMetrics are the job loop's Prometheus series.
type loopMetrics struct {
	assigned      metrics.Counter
	dropped       metrics.Counter
	finished      metrics.Counter
	pending       metrics.Gauge
	sessions      metrics.Gauge
	readyToAssign summary
	claimSeconds  summary
}

// summary is a Prometheus summary without quantiles: a sum and a count.
type summary struct{ sum, count metrics.Counter }

func (s summary) Observe(v float64) {
	s.sum.Add(v)
	s.count.Inc()
}

func newLoopMetrics(r *metrics.Registry) *loopMetrics {
	return &loopMetrics{
		assigned: r.NewCounter("gradient_scheduler_assignments_total", "Jobs assigned to workers."),
		dropped:  r.NewCounter("gradient_scheduler_reports_dropped_total", "Job reports for jobs the session does not hold."),
		finished: r.NewCounter("gradient_scheduler_jobs_finished_total", "Job outcomes reported by workers.", "outcome"),
		pending:  r.NewGauge("gradient_scheduler_jobs_pending", "Jobs waiting for a worker."),
		sessions: r.NewGauge("gradient_scheduler_sessions", "Worker sessions the job loop serves."),
		readyToAssign: summary{
			r.NewCounter("gradient_scheduler_ready_to_assign_seconds_sum", "Time from a job becoming ready to its assignment (sum)."),
			r.NewCounter("gradient_scheduler_ready_to_assign_seconds_count", "Time from a job becoming ready to its assignment (count)."),
		},
		claimSeconds: summary{
			r.NewCounter("gradient_scheduler_claim_seconds_sum", "Database time of job claims (sum)."),
			r.NewCounter("gradient_scheduler_claim_seconds_count", "Database time of job claims (count)."),
		},
	}
}
