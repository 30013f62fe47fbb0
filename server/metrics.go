package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/secret"
)

// serverMetrics are the server's own Prometheus series on Config.Metrics,
// beside the authority's (gradient_server_…), the cache's (gradient_cache_…)
// and the job loop's: its argon2id token checks and its dialer.
type serverMetrics struct {
	registry *prometheus.Registry
	tokens   *secret.CheckMetrics

	dialRescans  prometheus.Counter
	dialTargets  *prometheus.GaugeVec
	dialAttempts *prometheus.CounterVec
	// branchPolls counts branch polls by result: polled, or elsewhere
	// (another server instance holds the branch's poll lease).
	branchPolls *prometheus.CounterVec
}

func newServerMetrics(r *prometheus.Registry) *serverMetrics {
	if r == nil {
		r = prometheus.NewRegistry()
	}
	m := &serverMetrics{registry: r, tokens: secret.NewCheckMetrics(r),
		dialRescans: prometheus.NewCounter(prometheus.CounterOpts{Name: "gradient_server_dial_rescans_total",
			Help: "Reads of the dial targets (registrations and team workers with a URL)."}),
		dialTargets: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gradient_server_dial_targets",
			Help: "Dial targets at the last rescan, by state: dialing, or not_dialed (proto.discoverable is off)."}, []string{"state"}),
		dialAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_server_dial_attempts_total",
			Help: "Dials of workers, by result: session (a session was established and has ended), failed, or elsewhere (another server instance holds the worker's dial lease: it dials it)."}, []string{"result"}),
		branchPolls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_server_branch_polls_total",
			Help: "Branch head polls of projects, by result: polled (this instance asked the repository) or elsewhere (another server instance polls it this interval)."}, []string{"result"}),
	}
	for _, result := range []string{"polled", "elsewhere"} {
		m.branchPolls.WithLabelValues(result)
	}
	for _, state := range []string{"dialing", "not_dialed"} {
		m.dialTargets.WithLabelValues(state)
	}
	for _, result := range []string{"session", "failed", "elsewhere"} {
		m.dialAttempts.WithLabelValues(result)
	}
	r.MustRegister(m.dialRescans, m.dialTargets, m.dialAttempts, m.branchPolls)
	return m
}

// argon2Checked is the secret.Verifier's Observe hook.
func (m *serverMetrics) argon2Checked(elapsed time.Duration, matched bool) {
	m.tokens.Checked(elapsed, matched)
}
