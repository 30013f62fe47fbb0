package scheduler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/wire"
)

// loopMetrics are the job loop's Prometheus series.
type loopMetrics struct {
	assigned        prometheus.Counter
	dropped         prometheus.Counter
	finished        *prometheus.CounterVec
	pending         prometheus.Gauge
	sessions        prometheus.Gauge
	dispatchLatency *prometheus.HistogramVec
	claimSeconds    prometheus.Histogram
	// releaseFailures counts the releases of assignments (declined, or
	// the worker gone) the database refused; each is tried again.
	releaseFailures prometheus.Counter
	// notes counts the notes between instances by event (sent,
	// received, dropped); noteReloads the full reads of the queue they
	// caused (notify.go).
	notes       *prometheus.CounterVec
	noteReloads prometheus.Counter
	// claimsLost counts claims of queued jobs the database refused: the
	// job was claimed elsewhere (another instance) or is no longer
	// pending (cancelled); each costs a statement.
	claimsLost prometheus.Counter
}

// dispatchBuckets span a job assigned at once (milliseconds: one claim
// and a network hop) to one that waited hours for a free worker.
var dispatchBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 14400}

// claimBuckets span one claim transaction, fast on SQLite, slower on a
// loaded PostgreSQL.
var claimBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// newLoopMetrics registers the series in r; registering them twice in
// one registry is a programming error of the embedding code.
func newLoopMetrics(r prometheus.Registerer, idle func(wire.JobKind) int) *loopMetrics {
	m := &loopMetrics{
		assigned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_scheduler_assignments_total", Help: "Jobs assigned to workers.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_scheduler_reports_dropped_total", Help: "Job reports for jobs the session does not hold.",
		}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_scheduler_jobs_finished_total", Help: "Job outcomes reported by workers.",
		}, []string{"outcome"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gradient_scheduler_jobs_pending", Help: "Jobs waiting for a worker.",
		}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gradient_scheduler_sessions", Help: "Worker sessions the job loop serves.",
		}),
		dispatchLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gradient_scheduler_ready_to_assign_seconds", Help: "Time from a job becoming ready (runnable) to its AssignJob, by job kind.",
			Buckets: dispatchBuckets,
		}, []string{"kind"}),
		claimSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gradient_scheduler_claim_seconds", Help: "Database time of job claims.",
			Buckets: claimBuckets,
		}),
		releaseFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_scheduler_release_failures_total",
			Help: "Returns of a declined or lost job to the queue that the database refused (each is tried again on the next pass).",
		}),
		notes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_scheduler_notes_total",
			Help: "Notes about work between the server instances sharing the database, by event: sent, received (from other instances), dropped (bad or over the bound).",
		}, []string{"event"}),
		claimsLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_scheduler_claims_lost_total",
			Help: "Claims of queued jobs the database refused: claimed by another server instance meanwhile, or no longer pending.",
		}),
		noteReloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_scheduler_note_reloads_total",
			Help: "Full reads of the job queue that notes caused: a reload note, an overflowing inbox, or listening again after a lost connection.",
		}),
	}
	collectors := []prometheus.Collector{m.assigned, m.dropped, m.finished, m.pending, m.sessions, m.dispatchLatency, m.claimSeconds, m.releaseFailures, m.notes, m.noteReloads, m.claimsLost}
	for kind, name := range map[wire.JobKind]string{wire.JobKindFlake: "flake", wire.JobKindBuild: "build"} {
		collectors = append(collectors, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "gradient_scheduler_sessions_idle",
			Help:        "Worker sessions that asked for a job of the kind and have none yet.",
			ConstLabels: prometheus.Labels{"kind": name},
		}, func() float64 { return float64(idle(kind)) }))
	}
	for _, c := range collectors {
		if err := r.Register(c); err != nil {
			panic(fmt.Sprintf("scheduler metrics: %v (give each scheduler its own registry)", err))
		}
	}
	return m
}
