package forgestatus

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	posted  *prometheus.CounterVec
	failed  *prometheus.CounterVec
	depth   prometheus.Gauge
	latency *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		posted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_forge_statuses_posted_total",
			Help: "Commit statuses the forges accepted, by forge kind and state.",
		}, []string{"kind", "state"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_forge_status_failures_total",
			Help: "Failed status posts by forge kind and reason: retryable (5xx, 429, rate limits, network; retried with backoff), permanent (retried a few times), given_up.",
		}, []string{"kind", "reason"}),
		depth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gradient_server_forge_status_outbox_depth",
			Help: "Commit statuses waiting to be posted, after the latest pass.",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gradient_server_forge_status_post_seconds",
			Help:    "Time of one status post to a forge, by kind.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}, []string{"kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.posted, m.failed, m.depth, m.latency)
	}
	return m
}
