package workersession

import (
	"context"
	"errors"
	"time"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
)

// dialLoop keeps one worker-dialed session up until ctx ends, waiting with
// backoff between attempts (docs/protocol/worker.md §3).
func (sh *Shell) dialLoop(ctx context.Context) {
	bo := newBackoff(sh.cfg.BackoffInitial, sh.cfg.BackoffMax)
	for ctx.Err() == nil {
		end, err := sh.connectOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if end == endRefused {
			sh.log.Warn("server rejected the worker: not dialing again", "server", gitsource.Redact(sh.cfg.ServerURL), "error", err)
			return
		}
		if end == endFailed {
			sh.m.connectFailures.Inc()
		}
		if end == endServed {
			bo.reset()
		}
		d := Jitter(bo.delay())
		if err != nil {
			sh.log.Warn("connection failed", "server", gitsource.Redact(sh.cfg.ServerURL), "error", err, "retry_in", d)
		} else {
			sh.log.Info("session ended", "how", end.String(), "reconnect_in", d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// connectOnce dials, runs the handshake and serves the session to its end.
func (sh *Shell) connectOnce(ctx context.Context) (sessionEnd, error) {
	t, err := session.Dial(ctx, sh.cfg.ServerURL, session.DialOptions{TLS: sh.cfg.DialTLS, ConnectTimeout: sh.cfg.ConnectTimeout, Logger: sh.log,
		Control: sh.cfg.DialControl})
	if err != nil {
		return endFailed, err
	}
	c := session.NewConn(t, session.ConnOptions{Logger: sh.log})
	tokens := sh.currentTokens()
	est, err := session.RunPeer(ctx, c, session.PeerConfig{
		WorkerID: sh.cfg.WorkerID, Capabilities: sh.cfg.Capabilities, Tokens: tokens, Timeout: sh.cfg.HandshakeTimeout,
	})
	if err != nil {
		t.Close(session.CloseNormal, "")
		var rejected *handshake.Error
		if errors.As(err, &rejected) && rejected.Remote && rejected.Code != 0 && sh.rejected(rejected.Code, rejected.Reason) {
			return endRefused, err
		}
		return endFailed, err
	}
	return sh.serve(ctx, c, est, tokens), nil
}

// rejected asks Config.OnRejected whether a server's Reject stops dialing.
func (sh *Shell) rejected(code uint16, reason string) bool {
	return sh.cfg.OnRejected != nil && sh.cfg.OnRejected(code, reason)
}

// serve runs an established session (either direction) until it ends.
func (sh *Shell) serve(ctx context.Context, c *session.Conn, est *session.Established, tokens map[string]string) sessionEnd {
	sess := session.SplitWorker(c, est, session.Options{
		AckTimeout: sh.cfg.AckTimeout, PingInterval: sh.cfg.PingInterval, DrainTimeout: sh.cfg.FlushTimeout, Logger: sh.log,
	})
	s := &Session{sh: sh, sess: sess, auth: session.NewWorkerAuth(est, tokens), log: sh.log.With("session_version", sess.Version())}
	s.h = sh.h.Open(s)
	sh.m.sessions.Inc()
	if sh.cfg.OnEstablished != nil {
		sh.cfg.OnEstablished()
	}
	sh.addLive(s)
	defer sh.removeLive(s)
	// A peers change between the handshake and addLive would be missed.
	if now := sh.currentTokens(); !samePeers(now, tokens) {
		if err := s.auth.RequestReauth(sess, now); err != nil {
			s.log.Warn("reauth request failed", "error", err)
		}
	}
	return s.run(ctx)
}
