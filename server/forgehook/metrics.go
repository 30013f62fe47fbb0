package forgehook

import (
	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/server/forge"
)

type metrics struct {
	receivedTotal *prometheus.CounterVec
	refusedTotal  *prometheus.CounterVec
	approvals     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		receivedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_forge_deliveries_total",
			Help: "Verified webhook deliveries by forge kind and what they did (push, pr, waiting_for_approval, pr_closed, ping, duplicate, ignored_*, ...).",
		}, []string{"kind", "result"}),
		refusedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_forge_deliveries_refused_total",
			Help: "Webhook deliveries refused, by forge kind and reason (signature, too_large, malformed, rate_limited, read).",
		}, []string{"kind", "reason"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_forge_comment_approvals_total",
			Help: "Approval comments on pull requests: approved (an evaluation each) or refused (no write access).",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.receivedTotal, m.refusedTotal, m.approvals)
	}
	return m
}

func (m *metrics) received(k forge.Kind, result string) {
	m.receivedTotal.WithLabelValues(string(k), result).Inc()
}

func (m *metrics) refused(k forge.Kind, reason string) {
	m.refusedTotal.WithLabelValues(string(k), reason).Inc()
}
