package server

import (
	"context"
	"errors"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage"
)

// dialOnce dials one target: connect, present the target's tokens, admit
// the worker and serve the session until it ends. It reports whether a
// session was established. A failure is kept as the worker's offline
// reason (a dial target is always a registered worker ID).
func (s *Server) dialOnce(ctx context.Context, key dialKey) bool {
	target, found, err := s.dialTarget(ctx, key)
	if err != nil || !found {
		if err != nil && ctx.Err() == nil {
			s.log.Warn("reading dial target failed", "worker", key.workerID, "error", err)
		}
		return false
	}
	tokens := s.dialTokens(target)
	if len(tokens) == 0 {
		s.dialFailed(key, "no token to present: rotate the worker's token")
		return false
	}
	// A dialed session counts against the connection limit like any other.
	select {
	case s.slots <- struct{}{}:
	default:
		s.metrics.refused.WithLabelValues("connection limit").Inc()
		s.dialFailed(key, "server at its connection limit")
		return false
	}
	defer func() { <-s.slots }()

	// session.Dial warns about a ws:// URL itself.
	dialStarted := time.Now()
	t, err := session.Dial(ctx, key.url, session.DialOptions{
		TLS: s.cfg.DialTLS, ConnectTimeout: s.cfg.DialConnectTimeout, Logger: s.log.With("worker", key.workerID),
	})
	if err != nil {
		s.metrics.handshakeEnded("dial failed", dialStarted)
		s.dialFailed(key, err.Error())
		return false
	}
	defer t.Close(session.CloseNormal, "")
	log := s.log.With("url", key.url) // serveSession adds the worker

	conn := &workerConn{connectedAt: time.Now(), dialURL: key.url}
	admitter := &dialAdmitter{s: s, conn: conn, url: key.url, presented: presentedPeers(tokens)}
	c := session.NewConn(t, session.ConnOptions{Logger: log})
	est, err := session.RunDialer(ctx, c, session.DialerConfig{
		WorkerID: key.workerID, Tokens: tokens, Policy: admitter, Capabilities: s.capabilities(), Timeout: s.cfg.HandshakeTimeout,
	})
	if err != nil {
		if admitter.reserved {
			s.live.release(conn)
		}
		s.dialHandshakeFailed(key, conn, c, err)
		return false
	}
	s.serveSession(log, conn, c, est, session.NewServerDialedAuth(est, admitter))
	return true
}

// dialTarget reads the current target of key: its registrations (and
// their sealed tokens) may have changed since the loop started.
func (s *Server) dialTarget(ctx context.Context, key dialKey) (storage.DialTarget, bool, error) {
	targets, err := s.db.DialTargets(ctx)
	if err != nil {
		return storage.DialTarget{}, false, err
	}
	for _, t := range targets {
		if t.WorkerID == key.workerID && t.URL == key.url {
			return t, true, nil
		}
	}
	return storage.DialTarget{}, false, nil
}

// dialHandshakeFailed keeps why a dialed handshake failed: the worker's
// Reject (e.g. 401 for a token it does not accept), the server's own, or
// the version agreement's refusal.
func (s *Server) dialHandshakeFailed(key dialKey, conn *workerConn, c *session.Conn, err error) {
	reason := err.Error()
	if refusal := c.Refusal(); refusal != "" {
		s.metrics.handshakeEnded("version refused", conn.connectedAt)
		reason = refusal
	} else if he := (*handshake.Error)(nil); errors.As(err, &he) && he.Code != 0 {
		s.metrics.handshakeEnded("rejected", conn.connectedAt)
	} else {
		s.metrics.handshakeEnded("aborted", conn.connectedAt)
	}
	s.dialFailed(key, reason)
}

func (s *Server) dialFailed(key dialKey, reason string) {
	s.log.Warn("dialing worker failed", "worker", key.workerID, "url", key.url, "reason", reason)
	s.offline.set(key.workerID, reason)
}
