package worker

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Two workers in one process (gradient up) share a registry when each
// wraps it with its own label; without one the second worker is refused
// with an error that says what to do, instead of a panic.
func TestWorkersShareARegistryWithALabelEach(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, name := range []string{"worker-1", "worker-2"} {
		cfg := testConfig(t, "ws://127.0.0.1:1/proto", newBlockingExecutor())
		cfg.Session.Metrics = prometheus.WrapRegistererWith(prometheus.Labels{"worker": name}, reg)
		if _, err := New(cfg); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	wantMetrics(t, reg, `gradient_worker_connected{worker="worker-1"} 0`, `gradient_worker_connected{worker="worker-2"} 0`)

	cfg := testConfig(t, "ws://127.0.0.1:1/proto", newBlockingExecutor())
	cfg.Session.Metrics = prometheus.WrapRegistererWith(prometheus.Labels{"worker": "worker-1"}, reg)
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "WrapRegistererWith") {
		t.Fatalf("a third worker with a label already taken: %v, want an error naming the remedy", err)
	}
}
