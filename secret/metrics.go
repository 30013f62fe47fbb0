package secret

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// argon2Buckets surround one argon2id check at our parameters (~20-50 ms)
// and show a host too loaded to keep up.
var argon2Buckets = []float64{.005, .01, .02, .03, .04, .05, .075, .1, .25, .5, 1}

// CheckMetrics are the argon2id check series of one process
// (gradient_secret_argon2id_…), shared by every Verifier it runs.
type CheckMetrics struct {
	checks  *prometheus.CounterVec
	seconds prometheus.Histogram
}

// NewCheckMetrics registers the series on r; a second registration on
// the same registry is a programming error of the embedding code.
func NewCheckMetrics(r prometheus.Registerer) *CheckMetrics {
	m := &CheckMetrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_secret_argon2id_verifications_total",
			Help: "argon2 token checks run for worker and admin tokens (remembered tokens skip them), by result.",
		}, []string{"result"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gradient_secret_argon2id_verification_duration_seconds", Help: "CPU time of one argon2 token check.",
			Buckets: argon2Buckets,
		}),
	}
	for _, c := range []prometheus.Collector{m.checks, m.seconds} {
		if err := r.Register(c); err != nil {
			panic(fmt.Sprintf("secret metrics: %v (register them once per registry)", err))
		}
	}
	return m
}

// Checked is a Verifier's Observe hook.
func (m *CheckMetrics) Checked(elapsed time.Duration, matched bool) {
	result := "mismatch"
	if matched {
		result = "match"
	}
	m.checks.WithLabelValues(result).Inc()
	m.seconds.Observe(elapsed.Seconds())
}
