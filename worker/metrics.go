package worker

import (
	"gradient.dev/gradient/metrics"
)

// workerMetrics are the worker's Prometheus series, in Config.Metrics
// (gradient-worker serves them on --metrics-addr).
type workerMetrics struct {
	sessions        metrics.Counter // established sessions
	connectFailures metrics.Counter // dials or handshakes that failed
	jobsRunning     metrics.Gauge   // by kind
	jobsFinished    metrics.Counter // by kind and outcome
	jobSeconds      metrics.Counter // by kind
	narBytes        metrics.Counter // by direction
}

func newWorkerMetrics(r *metrics.Registry, w *Worker) *workerMetrics {
	r.NewGaugeFunc("gradient_worker_connected", "Sessions with a server established now.", func() float64 {
		w.mu.Lock()
		defer w.mu.Unlock()
		return float64(len(w.live))
	})
	return &workerMetrics{
		sessions:        r.NewCounter("gradient_worker_sessions_total", "Sessions established with a server."),
		connectFailures: r.NewCounter("gradient_worker_connect_failures_total", "Dials or handshakes that failed."),
		jobsRunning:     r.NewGauge("gradient_worker_jobs_running", "Jobs running now.", "kind"),
		jobsFinished: r.NewCounter("gradient_worker_jobs_finished_total",
			"Jobs ended: completed, the failure kind (as on the wire), or lost with their session.", "kind", "outcome"),
		jobSeconds: r.NewCounter("gradient_worker_job_seconds_total", "Time spent running jobs.", "kind"),
		narBytes: r.NewCounter("gradient_worker_nar_bytes_total",
			"Compressed NAR bytes moved over the session: pulled from or uploaded to the server's cache.", "direction"),
	}
}
