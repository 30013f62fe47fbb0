package authority

import (
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// Reauth runs a server-side reauth of a live session, after a peer
// registered the worker or a project changed what it grants. A
// worker-dialed session is challenged (or, with a challenge outstanding,
// challenged again after its response); a server-dialed one gets an
// AuthUpdate at once, and is closed when its DialedPolicy asks for a
// redial, so the next dial presents the new token. It reports whether a
// session was reauthorized.
func (a *Authority) Reauth(workerID string) bool {
	conn := a.live.get(workerID)
	if conn == nil {
		return false
	}
	conn.mu.Lock()
	sess, reauth := conn.sess, conn.reauth
	if sess == nil {
		// Admitted, with the InitAck on its way: reauth once the session
		// is up, so a registration made meanwhile is not missed.
		conn.reauthPending = true
	}
	conn.mu.Unlock()
	if sess == nil {
		a.metrics.reauths.WithLabelValues("server", "deferred").Inc()
		return true
	}
	sent, redial, err := session.Reauth(a.ctx, sess, reauth)
	if err != nil {
		a.metrics.reauths.WithLabelValues("server", "failed").Inc()
		a.log.Warn("reauth failed", "worker", workerID, "error", err)
		return false
	}
	switch m := sent.(type) {
	case nil:
		a.metrics.reauths.WithLabelValues("server", "joined").Inc()
		a.log.Info("reauth joins the outstanding challenge", "worker", workerID)
	case *wire.AuthChallenge:
		a.metrics.reauths.WithLabelValues("server", "sent").Inc()
		a.log.Info("reauthorizing worker", "worker", workerID, "peers", len(m.Peers))
	default:
		a.metrics.reauths.WithLabelValues("server", "sent").Inc()
		a.log.Info("reauthorized dialed worker", "worker", workerID, "redial", redial)
	}
	return true
}
