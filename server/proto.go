package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// serveProto upgrades /proto and runs one worker session: version
// agreement, the authority handshake, then the dispatch loop.
func (s *Server) serveProto(w http.ResponseWriter, r *http.Request) {
	// Unauthenticated sockets are capped per IP and in all before they
	// may take a session slot, so one client holding idle sockets locks
	// no worker out.
	handshakeDone, ok := s.admitHandshake(w, r)
	if !ok {
		return
	}
	defer handshakeDone()
	// The connection limiter refuses instead of queueing (SESSION.md §9).
	select {
	case s.slots <- struct{}{}:
	default:
		s.metrics.refused.WithLabelValues("connection limit").Inc()
		http.Error(w, "too many connections", http.StatusServiceUnavailable)
		return
	}
	defer func() { <-s.slots }()
	t, err := session.Accept(w, r)
	if err != nil {
		s.log.Warn("websocket upgrade failed", "remote", r.RemoteAddr, "error", err)
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	defer t.Close(session.CloseNormal, "")
	s.runWorkerSession(t, r.RemoteAddr, handshakeDone)
}

// admitHandshake takes the pre-authentication permits of a /proto upgrade:
// one of the client IP's and one of all unauthenticated sessions'. done
// returns both; it may be called more than once.
func (s *Server) admitHandshake(w http.ResponseWriter, r *http.Request) (done func(), ok bool) {
	releaseIP, ok := s.handshakesPerIP.TryAcquire(clientIP(r))
	if !ok {
		s.metrics.refused.WithLabelValues("handshakes per IP").Inc()
		http.Error(w, "too many unauthenticated connections from this address", http.StatusServiceUnavailable)
		return nil, false
	}
	select {
	case s.handshakes <- struct{}{}:
	default:
		releaseIP()
		s.metrics.refused.WithLabelValues("handshake limit").Inc()
		http.Error(w, "too many unauthenticated connections", http.StatusServiceUnavailable)
		return nil, false
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-s.handshakes
			releaseIP()
		})
	}, true
}

// runWorkerSession runs a worker-dialed session; handshakeDone is called
// once the handshake has ended, either way.
func (s *Server) runWorkerSession(t session.Transport, remote string, handshakeDone func()) {
	ctx := s.ctx
	log := s.log.With("remote", remote)
	conn := &workerConn{connectedAt: time.Now()}
	auth := &connAuthority{s: s, conn: conn}
	c := session.NewConn(t, session.ConnOptions{Logger: log})
	est, err := session.RunAuthority(ctx, c, session.AuthorityConfig{Policy: auth, Capabilities: s.capabilities(), Timeout: s.cfg.HandshakeTimeout})
	handshakeDone()
	if err != nil {
		if auth.reserved {
			s.live.release(conn)
		}
		s.handshakeFailed(log, c, auth, err)
		return
	}
	auth.established = true
	s.serveSession(log, conn, c, est, session.NewWorkerDialedAuth(est, auth))
}

// serveSession runs an established session, worker- or server-dialed,
// until it ends: the dispatch loop, then the worker ID is freed and why
// the session ended is kept as the worker's offline reason.
func (s *Server) serveSession(log *slog.Logger, conn *workerConn, c *session.Conn, est *session.Established, reauth *session.ServerAuth) {
	ctx := s.ctx
	workerID := est.WorkerID
	log = log.With("worker", workerID)
	sess := session.SplitServer(c, est, session.Options{HeartbeatTimeout: s.cfg.HeartbeatTimeout, Logger: log})
	conn.mu.Lock()
	conn.sess = sess
	conn.reauth = reauth
	conn.capabilities = est.Capabilities
	pending := conn.reauthPending
	conn.reauthPending = false
	kicked := conn.kickReason
	conn.mu.Unlock()
	s.metrics.handshakeEnded("accepted", conn.connectedAt)
	log.Info("worker connected", "version", est.Version, "authorized", est.AuthorizedPeers,
		"failed", len(est.FailedPeers), "capabilities", capabilityNames(est.Capabilities))
	if kicked != "" {
		// Disconnected (e.g. deactivated) while its InitAck was on the way.
		go sess.Close(session.ClosePolicy, kicked)
	} else if pending {
		s.Reauth(workerID)
	}

	live := newLiveWorker(conn, est.Version, sess.Send)
	cache := newCacheConn(s, log, sess.Send, workerCacheScope{db: s.db, conn: conn, jobs: s.cfg.Jobs, live: live}, false)
	if s.cfg.Jobs != nil {
		s.cfg.Jobs.SessionStarted(live)
	}
	reason := s.dispatch(ctx, log, conn, sess, reauth, cache, live)
	sess.Close(session.CloseNormal, reason)
	<-sess.Done()
	cache.close() // after the session, so no transfer waits on its writer
	if r := sess.Reason(); r != "" {
		reason = r
	}
	if s.cfg.Jobs != nil {
		s.cfg.Jobs.SessionEnded(live, reason)
	}
	// The reason first, so whoever sees the worker gone also sees why.
	s.offline.set(workerID, reason)
	s.live.release(conn)
	log.Info("worker disconnected", "reason", reason, "connected_for", time.Since(conn.connectedAt).Round(time.Millisecond))
}

// handshakeFailed logs a failed handshake and keeps it as the offline
// reason of a registered worker ID.
func (s *Server) handshakeFailed(log *slog.Logger, c *session.Conn, auth *connAuthority, err error) {
	if refusal := c.Refusal(); refusal != "" {
		s.metrics.handshakeEnded("version refused", auth.conn.connectedAt)
		return // the session layer logged the refusal at warn
	}
	var he *handshake.Error
	workerID := ""
	if errors.As(err, &he) {
		workerID = he.WorkerID
		if he.Code != 0 {
			s.metrics.handshakeEnded("rejected", auth.conn.connectedAt)
		} else {
			s.metrics.handshakeEnded("aborted", auth.conn.connectedAt)
		}
	}
	log.Warn("worker handshake failed", "worker", workerID, "error", err)
	if auth.known && workerID != "" {
		s.offline.set(workerID, err.Error())
	}
}

// dispatch handles the messages of an established session until it ends,
// and says why it ended.
func (s *Server) dispatch(ctx context.Context, log *slog.Logger, conn *workerConn, sess *session.ServerSession, reauth *session.ServerAuth, cache *cacheConn, live *LiveWorker) string {
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return "server stopping"
			}
			return "connection lost: " + err.Error()
		}
		s.metrics.messages.WithLabelValues(m.WireName()).Inc()
		handled, err := session.ServeAuth(ctx, sess, reauth, m)
		if _, ok := m.(*wire.ReauthRequest); ok {
			outcome := "sent"
			if err != nil {
				outcome = "failed"
			}
			s.metrics.reauths.WithLabelValues("worker", outcome).Inc()
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
		if isCacheMessage(m) {
			cache.handle(m)
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
		case *wire.RequestJobList:
			if s.cfg.Jobs == nil {
				// No job loop (a cache-only server): the list is one
				// final, empty page.
				sess.Send(&wire.JobListChunk{IsFinal: true})
			}
		case *wire.ImportRequest:
			if s.cfg.Jobs == nil {
				sess.Send(RefuseImport(m))
			}
		case *wire.WorkerMetrics:
			// Liveness: any message resets the heartbeat.
		default:
			if !isJobMessage(m) {
				log.Debug("ignoring message", "message", m.WireName())
			}
		}
		if s.cfg.Jobs != nil && isJobMessage(m) {
			s.cfg.Jobs.HandleJobMessage(live, m)
		}
	}
}

// Reauth runs a server-side reauth of a live session, after a peer
// registered the worker or a project changed what it grants. A
// worker-dialed session is challenged (or, with a challenge outstanding,
// challenged again after its response); a server-dialed one gets an
// AuthUpdate at once, and is closed when a new registration appeared at
// its URL, so the next dial presents its token. It reports whether a
// session was reauthorized.
func (s *Server) Reauth(workerID string) bool {
	conn := s.live.get(workerID)
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
		s.metrics.reauths.WithLabelValues("server", "deferred").Inc()
		return true
	}
	sent, redial, err := session.Reauth(s.ctx, sess, reauth)
	if err != nil {
		s.metrics.reauths.WithLabelValues("server", "failed").Inc()
		s.log.Warn("reauth failed", "worker", workerID, "error", err)
		return false
	}
	switch m := sent.(type) {
	case nil:
		s.metrics.reauths.WithLabelValues("server", "joined").Inc()
		s.log.Info("reauth joins the outstanding challenge", "worker", workerID)
	case *wire.AuthChallenge:
		s.metrics.reauths.WithLabelValues("server", "sent").Inc()
		s.log.Info("reauthorizing worker", "worker", workerID, "peers", len(m.Peers))
	default:
		s.metrics.reauths.WithLabelValues("server", "sent").Inc()
		s.log.Info("reauthorized dialed worker", "worker", workerID, "redial", redial)
	}
	return true
}

func capabilityNames(c wire.GradientCapabilities) []string {
	var out []string
	for _, f := range []struct {
		on   bool
		name string
	}{{c.Core, "core"}, {c.Federate, "federate"}, {c.Fetch, "fetch"}, {c.Eval, "eval"}, {c.Build, "build"}, {c.Cache, "cache"}} {
		if f.on {
			out = append(out, f.name)
		}
	}
	return out
}
