package downstream

import "gradient.dev/gradient/wire"

// What the Hetzner reconciler (proxy/hetzner) asks of a VM's worker
// session.

// Connected reports whether an established session holds the worker.
func (l *Leg) Connected(workerID string) bool { return l.auth.Session(workerID) != nil }

// Busy reports whether the worker runs a job the proxy forwarded to it.
// The proxy forwards no jobs yet (job forwarding, issue 18, is planned),
// so no worker is busy; forwarding reports its assignments here.
func (l *Leg) Busy(workerID string) bool { return false }

// Drain sends Draining to the worker's session: it requests nothing more
// and finishes what it runs. It reports whether a session got it.
func (l *Leg) Drain(workerID string) bool {
	s := l.auth.Session(workerID)
	return s != nil && s.Send(&wire.ServerDraining{}) == nil
}
