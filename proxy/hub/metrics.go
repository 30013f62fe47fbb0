package hub

import (
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

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
	narPauses    *prometheus.CounterVec
	narResumes   *prometheus.CounterVec
	narGiveUps   *prometheus.CounterVec
	narBytes     *prometheus.CounterVec
	bounded      *prometheus.CounterVec
	bookSize     *prometheus.GaugeVec
	bookBytes    *prometheus.GaugeVec

	// gone are the removed tenants' IDs (copy on write): a message
	// still in flight for a removed hub records nothing, so no series
	// of a deleted tenant comes back.
	goneMu sync.Mutex
	gone   atomic.Pointer[map[string]struct{}]
}

// forget deletes the tenant's series and records none of it again.
func (m *Metrics) forget(tenant string) {
	if m == nil {
		return
	}
	m.goneMu.Lock()
	next := map[string]struct{}{tenant: {}}
	if old := m.gone.Load(); old != nil {
		maps.Copy(next, *old)
	}
	m.gone.Store(&next)
	m.goneMu.Unlock()
	match := prometheus.Labels{"tenant": tenant}
	m.assignments.DeletePartialMatch(match)
	m.dropped.DeletePartialMatch(match)
	m.slow.DeletePartialMatch(match)
	m.upstreamLost.DeletePartialMatch(match)
	m.queueWait.DeletePartialMatch(match)
	m.narPauses.DeletePartialMatch(match)
	m.narResumes.DeletePartialMatch(match)
	m.narGiveUps.DeletePartialMatch(match)
	m.narBytes.DeletePartialMatch(match)
	m.bounded.DeletePartialMatch(match)
	m.bookSize.DeletePartialMatch(match)
	m.bookBytes.DeletePartialMatch(match)
}

// on reports whether the tenant's series are recorded.
func (m *Metrics) on(tenant string) bool {
	if m == nil {
		return false
	}
	if gone := m.gone.Load(); gone != nil {
		_, removed := (*gone)[tenant]
		return !removed
	}
	return true
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
		narBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_nar_bytes_total",
			Help: "Compressed NAR bytes that passed through the hub: NarPush data from the tenant's server (download) and UploadChunk data to it (upload). Presigned transfers never pass."}, []string{"tenant", "direction"}),
		narPauses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_nar_pauses_total",
			Help: "NAR pulls paused because the worker's outgoing queue passed its high-water mark (the rest of the stream is dropped until it drains)."}, []string{"tenant"}),
		narResumes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_nar_resumes_total",
			Help: "NarRequestResumes the proxy sent the tenant's server for paused pulls once the worker's queue drained."}, []string{"tenant"}),
		narGiveUps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_nar_given_up_total",
			Help: "Paused NAR pulls the proxy gave up (NarAbort to the worker): resumed too often without progress or restarted by the server."}, []string{"tenant"}),
		bounded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gradient_proxy_hub_bounded_total",
			Help: "What the proxy's per-tenant limits dropped or refused, by bound: offered or listed candidates past book_candidates or book_bytes, workers' cache queries past pending_queries, uploads past pending_uploads."}, []string{"tenant", "bound"}),
		bookSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gradient_proxy_hub_book_candidates",
			Help: "Candidates the proxy holds in the tenant's mirrored offer book."}, []string{"tenant"}),
		bookBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gradient_proxy_hub_book_bytes",
			Help: "Memory the tenant's mirrored offer book holds, as the proxy estimates it for its limit."}, []string{"tenant"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.assignments, m.dropped, m.slow, m.upstreamLost, m.queueWait, m.narPauses, m.narResumes, m.narGiveUps, m.narBytes,
			m.bounded, m.bookSize, m.bookBytes} {
			if err := reg.Register(c); err != nil {
				return nil, errors.Join(errors.New("hub metrics"), err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) assigned(tenant, outcome string) {
	if m.on(tenant) {
		m.assignments.WithLabelValues(tenant, outcome).Inc()
	}
}

func (m *Metrics) droppedMessage(tenant, msg string) {
	if m.on(tenant) {
		m.dropped.WithLabelValues(tenant, msg).Inc()
	}
}

func (m *Metrics) slowWorker(tenant string) {
	if m.on(tenant) {
		m.slow.WithLabelValues(tenant).Inc()
	}
}

func (m *Metrics) lost(tenant string) {
	if m.on(tenant) {
		m.upstreamLost.WithLabelValues(tenant).Inc()
	}
}

func (m *Metrics) waited(tenant string, d time.Duration) {
	if m.on(tenant) {
		m.queueWait.WithLabelValues(tenant).Observe(d.Seconds())
	}
}

func (m *Metrics) narPassed(tenant, direction string, n int) {
	if n > 0 && m.on(tenant) {
		m.narBytes.WithLabelValues(tenant, direction).Add(float64(n))
	}
}

func (m *Metrics) narPaused(tenant string) {
	if m.on(tenant) {
		m.narPauses.WithLabelValues(tenant).Inc()
	}
}

func (m *Metrics) narResumed(tenant string) {
	if m.on(tenant) {
		m.narResumes.WithLabelValues(tenant).Inc()
	}
}

func (m *Metrics) narGivenUp(tenant string) {
	if m.on(tenant) {
		m.narGiveUps.WithLabelValues(tenant).Inc()
	}
}

func (m *Metrics) boundedDrops(tenant string, d drops) {
	if !m.on(tenant) {
		return
	}
	for b, n := range d {
		if n > 0 {
			m.bounded.WithLabelValues(tenant, boundNames[b]).Add(float64(n))
		}
	}
}

func (m *Metrics) book(tenant string, held candidateSet) {
	if m.on(tenant) {
		m.bookSize.WithLabelValues(tenant).Set(float64(held.count))
		m.bookBytes.WithLabelValues(tenant).Set(float64(held.bytes))
	}
}
