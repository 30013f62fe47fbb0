package authority

import (
	"context"
	"errors"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// Dialed is a session the authority's owner dials to a worker.
type Dialed struct {
	WorkerID string
	URL      string
	// Tokens are what the dial presents, one per peer.
	Tokens []wire.Pair[string, string]
	Policy DialedPolicy
	// Connect opens the transport (session.Dial, or session.Pipe in
	// tests); ServeDialed calls it once it holds a connection slot.
	Connect func(ctx context.Context) (session.Transport, error)
}

// ServeDialed runs one dialed session: it takes a connection slot, calls
// d.Connect, presents d.Tokens, admits the worker through d.Policy and
// serves the session until it ends. It reports whether a session was
// established; a failure is kept as the worker's offline reason (a dial
// target is a registered worker ID). ctx bounds the connect and the
// handshake; the session itself ends on Close. The caller tracks its own
// goroutine: Close does not wait for ServeDialed.
func (a *Authority) ServeDialed(ctx context.Context, d Dialed) bool {
	// A dialed session counts against the connection limit like any other.
	release, ok := a.TakeSlot()
	if !ok {
		a.DialFailed(d.WorkerID, d.URL, "server at its connection limit")
		return false
	}
	defer release()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer context.AfterFunc(a.ctx, func() { stop(context.Cause(a.ctx)) })()

	dialStarted := time.Now()
	t, err := d.Connect(ctx)
	if err != nil {
		a.metrics.handshakeEnded("dial failed", dialStarted)
		a.DialFailed(d.WorkerID, d.URL, err.Error())
		return false
	}
	defer t.Close(session.CloseNormal, "")
	log := a.log.With("url", d.URL) // serveSession adds the worker

	conn := &workerConn{connectedAt: time.Now(), dialURL: d.URL, nonce: newNonce()}
	ad := &dialAdmission{a: a, conn: conn, policy: d.Policy}
	c := session.NewConn(t, session.ConnOptions{Logger: log})
	est, err := session.RunDialer(ctx, c, session.DialerConfig{
		WorkerID: d.WorkerID, Tokens: d.Tokens, Policy: ad, Capabilities: a.capabilities(), Timeout: a.cfg.HandshakeTimeout,
	})
	if err != nil {
		if ad.reserved {
			a.releaseConn(conn)
		}
		a.dialHandshakeFailed(d, conn, c, err)
		return false
	}
	a.serveSession(log, conn, c, est, session.NewServerDialedAuth(est, ad))
	return true
}

// dialHandshakeFailed keeps why a dialed handshake failed: the worker's
// Reject (e.g. 401 for a token it does not accept), the authority's own,
// or the version agreement's refusal.
func (a *Authority) dialHandshakeFailed(d Dialed, conn *workerConn, c *session.Conn, err error) {
	reason := err.Error()
	if refusal := c.Refusal(); refusal != "" {
		a.metrics.handshakeEnded("version refused", conn.connectedAt)
		reason = refusal
	} else if he := (*handshake.Error)(nil); errors.As(err, &he) && he.Code != 0 {
		a.metrics.handshakeEnded("rejected", conn.connectedAt)
	} else {
		a.metrics.handshakeEnded("aborted", conn.connectedAt)
	}
	a.DialFailed(d.WorkerID, d.URL, reason)
}

// DialFailed logs why a dial of a registered worker failed and keeps it as
// the worker's offline reason.
func (a *Authority) DialFailed(workerID, url, reason string) {
	a.log.Warn("dialing worker failed", "worker", workerID, "url", url, "reason", reason)
	a.offline.set(workerID, reason)
}
