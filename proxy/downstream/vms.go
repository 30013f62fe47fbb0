package downstream

import "gradient.dev/gradient/wire"

// What the Hetzner reconciler (proxy/hetzner) asks of a VM's worker
// session.

// Connected reports whether an established session holds the worker.
func (l *Leg) Connected(workerID string) bool { return l.auth.Session(workerID) != nil }

// Busy reports whether the worker holds a job the proxy forwarded to it
// (its tenant's hub knows); without hubs no worker is busy.
func (l *Leg) Busy(workerID string) bool {
	if l.hubs == nil {
		return false
	}
	l.mu.Lock()
	tenant, ok := l.tenantOf[workerID]
	l.mu.Unlock()
	return ok && l.hubs.Tenant(tenant).Holds(workerID)
}

// Drain sends Draining to the worker's session: it requests nothing more
// and finishes what it runs. It reports whether a session got it.
func (l *Leg) Drain(workerID string) bool {
	s := l.auth.Session(workerID)
	return s != nil && s.Send(&wire.ServerDraining{}) == nil
}
