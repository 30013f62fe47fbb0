package server

import (
	"context"
	"fmt"
	"sync/atomic"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// dialAdmitter is the session.Admitter of one session the server dialed at
// url. It decides with the server's rules on the registrations at url
// (those whose tokens the dial presented), claims the worker ID (496 when
// the worker is connected already), and on reauth adds what the worker is
// now granted.
type dialAdmitter struct {
	s    *Server
	conn *workerConn
	url  string
	// established: the handshake is over, so Admit answers reauths.
	established atomic.Bool
	reserved    bool // the handshake claimed the worker ID
}

func (a *dialAdmitter) Admit(ctx context.Context, workerID string, _ wire.GradientCapabilities) (handshake.Decision, error) {
	rec, err := a.s.workerRecord(ctx, workerID)
	if err != nil {
		return handshake.Decision{}, fmt.Errorf("reading worker %s: %w", workerID, err)
	}
	g := admitDialed(rec.DialedAt(a.url))
	if a.established.Load() {
		// Reauth: add what the worker is granted now; never revoke.
		if !g.Rejected() {
			a.conn.merge(g)
		}
		return g.Decision, nil
	}
	if !a.s.Accepting() {
		return handshake.Reject(403, "server is not accepting connections"), nil
	}
	if g.Rejected() {
		return g.Decision, nil
	}
	a.conn.workerID = rec.WorkerID
	a.conn.grant = g
	if !a.s.live.reserve(ctx, a.conn) {
		return handshake.AlreadyConnected.Decide(), nil
	}
	a.reserved = true
	return g.Decision, nil
}
