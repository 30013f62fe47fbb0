package worker

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// workerMetrics are the worker's Prometheus series, in Config.Metrics
// (gradient-worker serves them on --metrics-addr).
type workerMetrics struct {
	jobsRunning    *prometheus.GaugeVec   // by kind
	jobsFinished   *prometheus.CounterVec // by kind and outcome
	jobSeconds     *prometheus.CounterVec // by kind
	jobDuration    *prometheus.HistogramVec
	narBytes       *prometheus.CounterVec // by direction
	narSeconds     *prometheus.HistogramVec
	narSizes       *prometheus.HistogramVec
	pullOverflows  prometheus.Counter
	presigned      *prometheus.CounterVec // by op and outcome
	presignedBytes *prometheus.CounterVec // by direction
}

// jobBuckets span an evaluation answered from Nix's cache (a fraction of
// a second) to a build of many hours.
var jobBuckets = []float64{.1, .5, 1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 57600}

// narSecondsBuckets span a small NAR over loopback to a large one over a
// slow link.
var narSecondsBuckets = []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900}

// narSizeBuckets span 1 KiB to 4 GiB in steps of four.
var narSizeBuckets = prometheus.ExponentialBuckets(1<<10, 4, 12)

// newWorkerMetrics registers the build runner's series in r, beside
// the session shell's (workersession). Two workers in one registry
// collide; each wraps it with its own constant label
// (prometheus.WrapRegistererWith), as gradient up does.
func newWorkerMetrics(r prometheus.Registerer) (*workerMetrics, error) {
	m := &workerMetrics{
		jobsRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gradient_worker_jobs_running", Help: "Jobs running now.",
		}, []string{"kind"}),
		jobsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_worker_jobs_finished_total",
			Help: "Jobs ended: completed, the failure kind (as on the wire), or lost with their session.",
		}, []string{"kind", "outcome"}),
		jobSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_worker_job_seconds_total", Help: "Time spent running jobs.",
		}, []string{"kind"}),
		jobDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gradient_worker_job_duration_seconds", Help: "Time from an AssignJob to the job's end, by kind and outcome as in gradient_worker_jobs_finished_total.",
			Buckets: jobBuckets,
		}, []string{"kind", "outcome"}),
		narBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_worker_nar_bytes_total",
			Help: "Compressed NAR bytes moved over the session: pulled from or uploaded to the server's cache.",
		}, []string{"direction"}),
		narSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gradient_worker_nar_transfer_duration_seconds", Help: "Time of one NAR pulled whole (download) or uploaded (upload), resumes and retries included.",
			Buckets: narSecondsBuckets,
		}, []string{"direction"}),
		narSizes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gradient_worker_nar_transfer_size_bytes", Help: "Compressed bytes of one NAR pulled whole (download) or uploaded (upload).",
			Buckets: narSizeBuckets,
		}, []string{"direction"}),
		pullOverflows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_worker_nar_pull_overflows_total",
			Help: "Times a NAR pull's buffer overflowed because the import into the store fell behind; each asks the server for the rest of the object again.",
		}),
		presigned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_worker_presigned_requests_total",
			Help: "Presigned transfers' HTTP requests to the object store by op (put, part of a multipart upload, get) and outcome (ok, retry, resume, failed; a failed one falls back to the session).",
		}, []string{"op", "outcome"}),
		presignedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_worker_presigned_bytes_total",
			Help: "Compressed NAR bytes moved straight between the worker and the object store over presigned URLs.",
		}, []string{"direction"}),
	}
	collectors := []prometheus.Collector{m.jobsRunning, m.jobsFinished, m.jobSeconds, m.jobDuration,
		m.narBytes, m.narSeconds, m.narSizes, m.pullOverflows, m.presigned, m.presignedBytes}
	for i, c := range collectors {
		if err := r.Register(c); err != nil {
			for _, registered := range collectors[:i] {
				r.Unregister(registered) // the registry stays as it was
			}
			return nil, fmt.Errorf("worker metrics: %w (two workers in one registry need a label each: prometheus.WrapRegistererWith)", err)
		}
	}
	return m, nil
}

// jobEnded counts a job's end by kind and outcome, and its duration.
func (m *workerMetrics) jobEnded(kind, outcome string, elapsed time.Duration) {
	m.jobsFinished.WithLabelValues(kind, outcome).Inc()
	m.jobDuration.WithLabelValues(kind, outcome).Observe(elapsed.Seconds())
}

// narMoved is the cache client's Moved hook.
func (m *workerMetrics) narMoved(download bool, n int) {
	m.narBytes.WithLabelValues(direction(download)).Add(float64(n))
}

// narTransferred is the cache client's Transferred hook.
func (m *workerMetrics) narTransferred(download bool, bytes uint64, elapsed time.Duration) {
	d := direction(download)
	m.narSeconds.WithLabelValues(d).Observe(elapsed.Seconds())
	m.narSizes.WithLabelValues(d).Observe(float64(bytes))
}

// narPullOverflowed is the cache client's Overflowed hook.
func (m *workerMetrics) narPullOverflowed() { m.pullOverflows.Inc() }

// presignedRequest is the cache client's Presigned hook.
func (m *workerMetrics) presignedRequest(op, outcome string) {
	m.presigned.WithLabelValues(op, outcome).Inc()
}

// presignedMoved is the cache client's PresignedMoved hook.
func (m *workerMetrics) presignedMoved(download bool, n int) {
	m.presignedBytes.WithLabelValues(direction(download)).Add(float64(n))
}

func direction(download bool) string {
	if download {
		return "download"
	}
	return "upload"
}
