package server

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serverMetrics are the server's Prometheus series, on Config.Metrics.
type serverMetrics struct {
	registry         *prometheus.Registry
	handshakes       *prometheus.CounterVec
	handshakeSeconds *prometheus.HistogramVec
	refused          *prometheus.CounterVec
	messages         *prometheus.CounterVec
	reauths          *prometheus.CounterVec
	argon2Checks     *prometheus.CounterVec
	argon2Seconds    prometheus.Histogram
	cache            *binaryCacheMetrics
}

// handshakeBuckets span a loopback handshake (milliseconds, one argon2id
// check included) to one that runs into the 15 s handshake timeout.
var handshakeBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30}

// argon2Buckets surround one argon2id check at the server's parameters
// (~20-50 ms) and show a host too loaded to keep up.
var argon2Buckets = []float64{.005, .01, .02, .03, .04, .05, .075, .1, .25, .5, 1}

func newServerMetrics(s *Server) *serverMetrics {
	r := s.cfg.Metrics
	if r == nil {
		r = prometheus.NewRegistry()
	}
	m := &serverMetrics{
		registry: r,
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_handshakes_total", Help: "Worker handshakes by outcome.",
		}, []string{"outcome"}),
		handshakeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gradient_server_handshake_duration_seconds",
			Help:    "Time from the upgrade (or the dial) to the handshake's outcome, by outcome as in gradient_server_handshakes_total.",
			Buckets: handshakeBuckets,
		}, []string{"outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_connections_refused_total", Help: "Upgrades refused before the handshake.",
		}, []string{"reason"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_messages_received_total", Help: "Messages received from workers.",
		}, []string{"message"}),
		reauths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_server_reauths_total",
			Help: "Reauthorizations of live workers, by who asked (server: a registration or grant changed; worker: its peers file did) and outcome: sent, joined an outstanding one, deferred until the session is up, or failed.",
		}, []string{"initiator", "outcome"}),
		argon2Checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_secret_argon2id_verifications_total",
			Help: "argon2 token checks run for worker and admin tokens (remembered tokens skip them), by result.",
		}, []string{"result"}),
		argon2Seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gradient_secret_argon2id_verification_duration_seconds", Help: "CPU time of one argon2 token check.",
			Buckets: argon2Buckets,
		}),
		cache: newBinaryCacheMetrics(),
	}
	collectors := []prometheus.Collector{m.handshakes, m.handshakeSeconds, m.refused, m.messages, m.reauths, m.argon2Checks, m.argon2Seconds,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gradient_server_workers_connected", Help: "Worker sessions up or handshaking.",
		}, func() float64 { return float64(s.live.count()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gradient_server_accepting_connections", Help: "1 while new worker sessions are accepted.",
		}, func() float64 {
			if s.Accepting() {
				return 1
			}
			return 0
		}),
	}
	collectors = append(collectors, m.cache.collectors()...)
	for _, c := range collectors {
		if err := r.Register(c); err != nil {
			// A programming error of the embedding code, found at start.
			panic(fmt.Sprintf("server metrics: %v (give each server its own registry)", err))
		}
	}
	return m
}

// handshakeEnded counts a handshake's outcome and how long it took since
// started (the upgrade or the dial).
func (m *serverMetrics) handshakeEnded(outcome string, started time.Time) {
	m.handshakes.WithLabelValues(outcome).Inc()
	m.handshakeSeconds.WithLabelValues(outcome).Observe(time.Since(started).Seconds())
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
