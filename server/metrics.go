package server

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serverMetrics are the server's own Prometheus series on Config.Metrics,
// beside the authority's (gradient_server_…), the cache's (gradient_cache_…)
// and the job loop's.
type serverMetrics struct {
	registry      *prometheus.Registry
	argon2Checks  *prometheus.CounterVec
	argon2Seconds prometheus.Histogram
}

// argon2Buckets surround one argon2id check at the server's parameters
// (~20-50 ms) and show a host too loaded to keep up.
var argon2Buckets = []float64{.005, .01, .02, .03, .04, .05, .075, .1, .25, .5, 1}

func newServerMetrics(r *prometheus.Registry) *serverMetrics {
	if r == nil {
		r = prometheus.NewRegistry()
	}
	m := &serverMetrics{
		registry: r,
		argon2Checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_secret_argon2id_verifications_total",
			Help: "argon2 token checks run for worker and admin tokens (remembered tokens skip them), by result.",
		}, []string{"result"}),
		argon2Seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gradient_secret_argon2id_verification_duration_seconds", Help: "CPU time of one argon2 token check.",
			Buckets: argon2Buckets,
		}),
	}
	collectors := []prometheus.Collector{m.argon2Checks, m.argon2Seconds}
	for _, c := range collectors {
		if err := r.Register(c); err != nil {
			// A programming error of the embedding code, found at start.
			panic(fmt.Sprintf("server metrics: %v (give each server its own registry)", err))
		}
	}
	return m
}

// argon2Checked is the secret.Verifier's Observe hook.
func (m *serverMetrics) argon2Checked(elapsed time.Duration, matched bool) {
	result := "mismatch"
	if matched {
		result = "match"
	}
	m.argon2Checks.WithLabelValues(result).Inc()
	m.argon2Seconds.Observe(elapsed.Seconds())
}
