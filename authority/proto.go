package authority

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/session/limit"
	"gradient.dev/gradient/wire"
)

// ServeWorker runs a session the worker dialed over t (version agreement,
// the handshake asking Config.Policy, then the dispatch loop) until it
// ends; remote names the peer in logs. The caller has admitted the
// connection (ProtoHandler applies the connection limits) and closes t
// afterwards.
func (a *Authority) ServeWorker(t session.Transport, remote string) {
	a.serveWorker(t, remote, nil)
}

// serveWorker runs a worker-dialed session; ticket (nil: the caller
// admitted it) is its place in the connection budget, marked while the
// worker's credentials are checked and established once the handshake
// succeeded, released when it failed.
func (a *Authority) serveWorker(t session.Transport, remote string, ticket *limit.Ticket) {
	log := a.log.With("remote", remote)
	if !a.enter() {
		// Close has begun: the same 1001 every session gets.
		ticket.Release()
		session.NewConn(t, session.ConnOptions{Logger: log}).Close(session.CloseGoingAway, ErrStopping.Error())
		return
	}
	defer a.wg.Done()
	ctx := a.ctx
	conn := &workerConn{connectedAt: time.Now(), remote: remote, nonce: newNonce()}
	ad := &admission{a: a, conn: conn, ticket: ticket}
	c := session.NewConn(t, session.ConnOptions{Logger: log})
	est, err := session.RunAuthority(ctx, c, session.AuthorityConfig{Policy: ad, Capabilities: a.capabilities(), Timeout: a.cfg.HandshakeTimeout})
	if err != nil {
		if ad.reserved {
			a.releaseConn(conn)
		}
		if ticket.WasShed() {
			a.metrics.handshakeEnded("shed", conn.connectedAt)
			log.Debug("unauthenticated session closed for a newer one", "error", err)
			return
		}
		ticket.Release()
		a.handshakeFailed(log, c, conn, ad.known, err)
		return
	}
	ticket.Established()
	ad.established = true
	a.serveSession(log, conn, c, est, session.NewWorkerDialedAuth(est, ad))
}

// serveSession runs an established session, worker- or server-dialed,
// until it ends: the dispatch loop, then the worker ID is freed and why
// the session ended is kept as the worker's offline reason.
func (a *Authority) serveSession(log *slog.Logger, conn *workerConn, c *session.Conn, est *session.Established, reauth *session.ServerAuth) {
	ctx := a.ctx
	workerID := est.WorkerID
	log = log.With("worker", workerID)
	sess := session.SplitServer(c, est, session.Options{HeartbeatTimeout: a.cfg.HeartbeatTimeout, Logger: log})
	live := newLiveWorker(conn, est.Version, sess.Send)
	live.out = sess.Writer
	conn.mu.Lock()
	conn.sess = sess
	conn.live = live
	conn.reauth = reauth
	conn.capabilities = est.Capabilities
	pending := conn.reauthPending
	conn.reauthPending = false
	kicked := conn.kickReason
	conn.mu.Unlock()
	a.metrics.handshakeEnded("accepted", conn.connectedAt)
	log.Info("worker connected", "version", est.Version, "authorized", est.AuthorizedPeers,
		"failed", len(est.FailedPeers), "capabilities", est.Capabilities.Names())
	if kicked != "" {
		// Disconnected (e.g. deactivated) while its InitAck was on the way.
		go sess.Close(session.ClosePolicy, kicked)
	} else if pending {
		a.Reauth(workerID)
	}

	var cache CacheHandler = noCache{log}
	if a.cfg.Cache != nil {
		cache = a.cfg.Cache(CacheSession{Ctx: ctx, Log: log, Worker: live})
	}
	a.cfg.Jobs.SessionStarted(live)
	reason := a.dispatch(ctx, log, conn, sess, reauth, cache, live)
	sess.Close(session.CloseNormal, reason)
	<-sess.Done()
	cache.Close() // after the session, so no transfer waits on its writer
	if r := sess.Reason(); r != "" {
		reason = r
	}
	a.cfg.Jobs.SessionEnded(live, reason)
	// The reason first, so whoever sees the worker gone also sees why.
	a.offline.set(workerID, reason)
	a.releaseConn(conn)
	log.Info("worker disconnected", "reason", reason, "connected_for", time.Since(conn.connectedAt).Round(time.Millisecond))
}

// noCache is the cache handler of an authority without a cache.
type noCache struct{ log *slog.Logger }

func (n noCache) Handle(m wire.ClientMessage) {
	n.log.Debug("ignoring message", "message", m.WireName())
}
func (noCache) Close() {}

// handshakeFailed logs a failed handshake and keeps it as the offline
// reason of a registered (known) worker ID.
func (a *Authority) handshakeFailed(log *slog.Logger, c *session.Conn, conn *workerConn, known bool, err error) {
	if refusal := c.Refusal(); refusal != "" {
		a.metrics.handshakeEnded("version refused", conn.connectedAt)
		return // the session layer logged the refusal at warn
	}
	var he *handshake.Error
	workerID := ""
	if errors.As(err, &he) {
		workerID = he.WorkerID
		if he.Code != 0 {
			a.metrics.handshakeEnded("rejected", conn.connectedAt)
		} else {
			a.metrics.handshakeEnded("aborted", conn.connectedAt)
		}
	}
	log.Warn("worker handshake failed", "worker", workerID, "error", err)
	// A second connection refused with 496 says nothing about the worker
	// ID's own session, which held it: recording it could overwrite why
	// that session ended a moment later (this goroutine records after the
	// worker already has its Reject).
	if known && workerID != "" && he.Code != handshake.AlreadyConnected.Code {
		a.offline.set(workerID, err.Error())
	}
}

// dispatch handles the messages of an established session until it ends,
// and says why it ended: auth messages here, cache messages to the cache
// handler, job messages to the job loop.
func (a *Authority) dispatch(ctx context.Context, log *slog.Logger, conn *workerConn, sess *session.ServerSession, reauth *session.ServerAuth, cache CacheHandler, live *LiveWorker) string {
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return "server stopping"
			}
			return "connection lost: " + err.Error()
		}
		a.metrics.messages.WithLabelValues(m.WireName()).Inc()
		handled, err := session.ServeAuth(ctx, sess, reauth, m)
		if _, ok := m.(*wire.ReauthRequest); ok {
			outcome := "sent"
			if err != nil {
				outcome = "failed"
			}
			a.metrics.reauths.WithLabelValues("worker", outcome).Inc()
		}
		if err != nil {
			log.Warn("reauth failed", "error", err)
			if errors.Is(err, session.ErrNoChallenge) {
				sess.Send(&wire.ServerError{Code: 400, Message: "unexpected AuthResponse"})
				return "protocol error: AuthResponse without AuthChallenge"
			}
			continue
		}
		if handled {
			continue
		}
		class := wire.ClientMessageClass(m)
		if class == wire.ClassCache {
			cache.Handle(m)
			if _, ok := m.(*wire.UploadChunk); ok {
				sess.Reader.Release() // the chunk is on disk: reuse its frame
			}
			continue
		}
		switch m := m.(type) {
		case *wire.InitConnection:
			sess.Send(&wire.ServerError{Code: 400, Message: "unexpected InitConnection"})
			return "protocol error: InitConnection after the handshake"
		case *wire.ClientReject:
			return "worker rejected the session: " + m.Reason
		case *wire.WorkerCapabilities:
			conn.mu.Lock()
			conn.workerCaps = m
			conn.mu.Unlock()
		case *wire.ClientDraining:
			conn.mu.Lock()
			conn.draining = true
			conn.mu.Unlock()
			log.Info("worker is draining: no more assignments")
		case *wire.WorkerMetrics:
			// Any message resets the heartbeat; this one is also the
			// worker's load, kept for the job loop and the status.
			conn.mu.Lock()
			conn.workerLoad = m
			conn.mu.Unlock()
		default:
			if class != wire.ClassJob {
				log.Debug("ignoring message", "message", m.WireName())
			}
		}
		if class == wire.ClassJob {
			a.cfg.Jobs.HandleJobMessage(live, m)
		}
	}
}
