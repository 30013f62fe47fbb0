package worker

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
func (w *Worker) dialLoop(ctx context.Context) {
	bo := newBackoff(w.cfg.BackoffInitial, w.cfg.BackoffMax)
	for ctx.Err() == nil {
		end, err := w.connectOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if end == endRefused {
			w.log.Warn("server rejected the worker: not dialing again", "server", gitsource.Redact(w.cfg.ServerURL), "error", err)
			return
		}
		if end == endFailed {
			w.m.connectFailures.Inc()
		}
		if end == endServed {
			bo.reset()
		}
		d := jitter(bo.delay())
		if err != nil {
			w.log.Warn("connection failed", "server", gitsource.Redact(w.cfg.ServerURL), "error", err, "retry_in", d)
		} else {
			w.log.Info("session ended", "how", end.String(), "reconnect_in", d)
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
func (w *Worker) connectOnce(ctx context.Context) (sessionEnd, error) {
	t, err := session.Dial(ctx, w.cfg.ServerURL, session.DialOptions{TLS: w.cfg.DialTLS, ConnectTimeout: w.cfg.ConnectTimeout, Logger: w.log,
		Control: w.cfg.DialControl})
	if err != nil {
		return endFailed, err
	}
	c := session.NewConn(t, session.ConnOptions{Logger: w.log})
	tokens := w.currentTokens()
	est, err := session.RunPeer(ctx, c, session.PeerConfig{
		WorkerID: w.cfg.WorkerID, Capabilities: w.cfg.Capabilities, Tokens: tokens, Timeout: w.cfg.HandshakeTimeout,
	})
	if err != nil {
		t.Close(session.CloseNormal, "")
		var rejected *handshake.Error
		if errors.As(err, &rejected) && rejected.Remote && rejected.Code != 0 && w.rejected(rejected.Code, rejected.Reason) {
			return endRefused, err
		}
		return endFailed, err
	}
	return w.serve(ctx, c, est, tokens), nil
}

// rejected asks Config.OnRejected whether a server's Reject stops dialing.
func (w *Worker) rejected(code uint16, reason string) bool {
	return w.cfg.OnRejected != nil && w.cfg.OnRejected(code, reason)
}

// serve runs an established session (either direction) until it ends.
func (w *Worker) serve(ctx context.Context, c *session.Conn, est *session.Established, tokens map[string]string) sessionEnd {
	sess := session.SplitWorker(c, est, session.Options{
		AckTimeout: w.cfg.AckTimeout, PingInterval: w.cfg.PingInterval, DrainTimeout: w.cfg.FlushTimeout, Logger: w.log,
	})
	ls := newLiveSession(w, sess, session.NewWorkerAuth(est, tokens))
	if w.cfg.Forwarder != nil {
		ls.fwd = w.cfg.Forwarder.Forward(ForwardedSession{Send: sess.Send, Version: sess.Version(),
			Capabilities: est.Capabilities, AuthorizedPeers: est.AuthorizedPeers, Log: ls.log})
	}
	w.m.sessions.Inc()
	if w.cfg.OnEstablished != nil {
		w.cfg.OnEstablished()
	}
	w.addLive(ls)
	defer w.removeLive(ls)
	// A peers change between the handshake and addLive would be missed.
	if now := w.currentTokens(); !samePeers(now, tokens) {
		if err := ls.auth.RequestReauth(sess, now); err != nil {
			ls.log.Warn("reauth request failed", "error", err)
		}
	}
	return ls.run(ctx)
}
