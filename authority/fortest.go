package authority

import "gradient.dev/gradient/wire"

// Test-only hooks; authoritytest wraps them for job loops' unit tests.

// NewLiveWorkerForTest makes a LiveWorker without a connection: it sends
// through send and has grant g, the negotiated caps and host's
// WorkerCapabilities (nil: none sent). Use authoritytest.NewLiveWorker.
func NewLiveWorkerForTest(workerID string, g Grant, caps wire.GradientCapabilities, host *wire.WorkerCapabilities, send func(wire.ServerMessage) error) *LiveWorker {
	conn := &workerConn{workerID: workerID, capabilities: caps, grant: g, workerCaps: host}
	return newLiveWorker(conn, wire.NewestVersion, send)
}

// DrainForTest marks w draining, as its session does when the worker
// sends Draining. Use authoritytest.Drain.
func DrainForTest(w *LiveWorker) {
	w.conn.mu.Lock()
	w.conn.draining = true
	w.conn.mu.Unlock()
}

// ForTest is a handle on the authority's internals for tests of the
// packages that embed it.
func (a *Authority) ForTest() TestHandle { return TestHandle{a} }

// TestHandle reads an authority's internals; see ForTest.
type TestHandle struct{ a *Authority }

// OfflineReasonsKept is how many worker IDs have an offline reason.
func (h TestHandle) OfflineReasonsKept() int {
	h.a.offline.mu.Lock()
	defer h.a.offline.mu.Unlock()
	return len(h.a.offline.reasons)
}

// HasOfflineReason reports whether workerID has an offline reason.
func (h TestHandle) HasOfflineReason(workerID string) bool {
	_, ok := h.a.offline.get(workerID)
	return ok
}

// Reauths is the reauth counter of initiator and outcome.
func (h TestHandle) Reauths(initiator, outcome string) float64 {
	return counterValue(h.a.metrics.reauths.WithLabelValues(initiator, outcome))
}

// MessagesReceived is how many messages named name (a wire name such as
// "WorkerMetrics") the authority's sessions have received.
func (h TestHandle) MessagesReceived(name string) float64 {
	return counterValue(h.a.metrics.messages.WithLabelValues(name))
}
