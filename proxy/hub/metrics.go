package hub

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the hubs' series (docs/METRICS.md), labelled by tenant ID.
// A nil *Metrics records nothing.
type Metrics struct {
	assignments  *prometheus.CounterVec
	dropped      *prometheus.CounterVec
	slow         *prometheus.CounterVec
	upstreamLost *prometheus.CounterVec
	queueWait    *prometheus.HistogramVec
}

// NewMetrics registers the hubs' series on reg (nil: nowhere).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_assignments_total",
			Help: "Upstream AssignJobs by outcome: forwarded to a worker behind the proxy, or declined (no capable worker waiting)."}, []string{"tenant", "outcome"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_dropped_messages_total",
			Help: "Worker messages dropped because the worker does not own the job or cluster attempt they name, by message."}, []string{"tenant", "message"}),
		slow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_slow_workers_total",
			Help: "Worker sessions cut off because their outgoing queue overflowed (a slow consumer)."}, []string{"tenant"}),
		upstreamLost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_upstream_lost_total",
			Help: "Upstream sessions to the tenant's server that ended, each aborting the tenant's jobs behind the proxy."}, []string{"tenant"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gradient_proxy_hub_queue_seconds",
			Help:    "Time a message for a worker behind the proxy waited in its outgoing queue.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}, []string{"tenant"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.assignments, m.dropped, m.slow, m.upstreamLost, m.queueWait} {
			if err := reg.Register(c); err != nil {
				return nil, errors.Join(errors.New("hub metrics"), err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) assigned(tenant, outcome string) {
	if m != nil {
		m.assignments.WithLabelValues(tenant, outcome).Inc()
	}
}

func (m *Metrics) droppedMessage(tenant, msg string) {
	if m != nil {
		m.dropped.WithLabelValues(tenant, msg).Inc()
	}
}

func (m *Metrics) slowWorker(tenant string) {
	if m != nil {
		m.slow.WithLabelValues(tenant).Inc()
	}
}

func (m *Metrics) lost(tenant string) {
	if m != nil {
		m.upstreamLost.WithLabelValues(tenant).Inc()
	}
}
