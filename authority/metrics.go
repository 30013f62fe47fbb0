package authority

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metrics are the authority's Prometheus series, named with
// Config.MetricsPrefix (gradient_server_… for the server).
type metrics struct {
	handshakes       *prometheus.CounterVec
	handshakeSeconds *prometheus.HistogramVec
	refused          *prometheus.CounterVec
	shed             *prometheus.CounterVec
	messages         *prometheus.CounterVec
	reauths          *prometheus.CounterVec
	claims           *prometheus.CounterVec
}

// handshakeBuckets span a loopback handshake (milliseconds, one argon2id
// check included) to one that runs into the 15 s handshake timeout.
var handshakeBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30}

func newMetrics(a *Authority) *metrics {
	p := a.cfg.MetricsPrefix
	m := &metrics{
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: p + "_handshakes_total", Help: "Worker handshakes by outcome.",
		}, []string{"outcome"}),
		handshakeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    p + "_handshake_duration_seconds",
			Help:    "Time from the upgrade (or the dial) to the handshake's outcome, by outcome as in " + p + "_handshakes_total.",
			Buckets: handshakeBuckets,
		}, []string{"outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: p + "_connections_refused_total", Help: "Upgrades refused before the handshake.",
		}, []string{"reason"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: p + "_connections_shed_total",
			Help: "Unauthenticated worker sessions closed to admit a newer one, by the limit reached (address prefix limit, handshake limit, connection limit) or to free file descriptors (file limit).",
		}, []string{"reason"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: p + "_messages_received_total", Help: "Messages received from workers.",
		}, []string{"message"}),
		reauths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: p + "_reauths_total",
			Help: "Reauthorizations of live workers, by who asked (server: a registration or grant changed; worker: its peers file did) and outcome: sent, joined an outstanding one, deferred until the session is up, or failed.",
		}, []string{"initiator", "outcome"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: p + "_session_claims_total",
			Help: "Worker IDs' claims across server instances sharing a database, by outcome: claimed, held elsewhere (answered 496), failed (the database), lost (taken over after this instance's lease ran out).",
		}, []string{"outcome"}),
	}
	collectors := []prometheus.Collector{m.handshakes, m.handshakeSeconds, m.refused, m.shed, m.messages, m.reauths, m.claims,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: p + "_workers_connected", Help: "Worker sessions up or handshaking.",
		}, func() float64 { return float64(a.live.count()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: p + "_accepting_connections", Help: "1 while new worker sessions are accepted.",
		}, func() float64 {
			if a.Accepting() {
				return 1
			}
			return 0
		}),
	}
	for _, c := range collectors {
		if err := a.cfg.Metrics.Register(c); err != nil {
			// A programming error of the embedding code, found at start.
			panic(fmt.Sprintf("authority metrics: %v (give each authority its own registry or prefix)", err))
		}
	}
	return m
}

// handshakeEnded counts a handshake's outcome and how long it took since
// started (the upgrade or the dial).
func (m *metrics) handshakeEnded(outcome string, started time.Time) {
	m.handshakes.WithLabelValues(outcome).Inc()
	m.handshakeSeconds.WithLabelValues(outcome).Observe(time.Since(started).Seconds())
}

// counterValue reads a counter (tests only).
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
