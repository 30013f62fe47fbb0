package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/secret"
)

// serverMetrics are the server's own Prometheus series on Config.Metrics,
// beside the authority's (gradient_server_…), the cache's (gradient_cache_…)
// and the job loop's: its argon2id token checks.
type serverMetrics struct {
	registry *prometheus.Registry
	tokens   *secret.CheckMetrics
}

func newServerMetrics(r *prometheus.Registry) *serverMetrics {
	if r == nil {
		r = prometheus.NewRegistry()
	}
	return &serverMetrics{registry: r, tokens: secret.NewCheckMetrics(r)}
}

// argon2Checked is the secret.Verifier's Observe hook.
func (m *serverMetrics) argon2Checked(elapsed time.Duration, matched bool) {
	m.tokens.Checked(elapsed, matched)
}
