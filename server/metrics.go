package server

import "gradient.dev/gradient/metrics"

type serverMetrics struct {
	registry   *metrics.Registry
	handshakes metrics.Counter
	refused    metrics.Counter
	messages   metrics.Counter
}

func newServerMetrics(s *Server) *serverMetrics {
	r := s.cfg.Metrics
	if r == nil {
		r = metrics.NewRegistry()
	}
	m := &serverMetrics{
		registry:   r,
		handshakes: r.NewCounter("gradient_server_handshakes_total", "Worker handshakes by outcome.", "outcome"),
		refused:    r.NewCounter("gradient_server_connections_refused_total", "Upgrades refused before the handshake.", "reason"),
		messages:   r.NewCounter("gradient_server_messages_received_total", "Messages received from workers.", "message"),
	}
	r.NewGaugeFunc("gradient_server_workers_connected", "Worker sessions up or handshaking.", func() float64 { return float64(s.live.count()) })
	r.NewGaugeFunc("gradient_server_accepting_connections", "1 while new worker sessions are accepted.", func() float64 {
		if s.Accepting() {
			return 1
		}
		return 0
	})
	return m
}
