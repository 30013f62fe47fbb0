package workersession

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// shellMetrics are the session series of a worker, in Config.Metrics
// (docs/METRICS.md; the build runner's own series sit beside them).
type shellMetrics struct {
	sessions        prometheus.Counter // established sessions
	connectFailures prometheus.Counter // dials or handshakes that failed
}

func newShellMetrics(r prometheus.Registerer, sh *Shell) (*shellMetrics, error) {
	m := &shellMetrics{
		sessions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_worker_sessions_total", Help: "Sessions established with a server.",
		}),
		connectFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_worker_connect_failures_total", Help: "Dials or handshakes that failed.",
		}),
	}
	connected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gradient_worker_connected", Help: "Sessions with a server established now.",
	}, func() float64 {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return float64(len(sh.live))
	})
	collectors := []prometheus.Collector{m.sessions, m.connectFailures, connected}
	for i, c := range collectors {
		if err := r.Register(c); err != nil {
			for _, registered := range collectors[:i] {
				r.Unregister(registered) // the registry stays as it was
			}
			return nil, fmt.Errorf("worker metrics: %w (two workers in one registry need a label each: prometheus.WrapRegistererWith)", err)
		}
	}
	return m, nil
}
