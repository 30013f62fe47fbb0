package workersession

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// sessionEnd is how a session ended; it decides the next reconnect delay.
type sessionEnd int

const (
	endFailed  sessionEnd = iota // no session: dial or handshake failed
	endServed                    // the session ran and was lost or closed
	endDrained                   // the server drained or refused it: back off further
	endStopped                   // the worker is stopping
	endRefused                   // the server rejected it and OnRejected stops dialing
)

func (e sessionEnd) String() string {
	return [...]string{"failed", "lost", "drained by the server", "stopped", "rejected by the server"}[e]
}

// Session is one established session as its handler sees it.
type Session struct {
	sh   *Shell
	sess *session.WorkerSession
	auth *session.WorkerAuth
	log  *slog.Logger
	h    SessionHandler

	// mu guards what follows; a leaf (docs/LOCKS.md): a handler may ask
	// Stopping under its own lock.
	mu       sync.Mutex
	drained  bool // the server sent Draining or Reject
	refused  bool // a Reject whose OnRejected hook stops dialing
	stopping bool // the worker is stopping: request and accept nothing more
}

// Send queues m on the session (both lanes as usual); it fails once the
// session is gone.
func (s *Session) Send(m wire.ClientMessage) error { return s.sess.Send(m) }

// Close ends the session, letting queued messages out first.
func (s *Session) Close(code int, reason string) { s.sess.Close(code, reason) }

// Done is closed when the session ended.
func (s *Session) Done() <-chan struct{} { return s.sess.Done() }

// Version is the agreed protocol version.
func (s *Session) Version() uint16 { return s.sess.Version() }

// Capabilities are the negotiated capabilities.
func (s *Session) Capabilities() wire.GradientCapabilities { return s.sess.Capabilities }

// AuthorizedPeers are the peers the handshake authorized.
func (s *Session) AuthorizedPeers() []string { return s.sess.AuthorizedPeers }

// Log is the session's logger.
func (s *Session) Log() *slog.Logger { return s.log }

// Release hands the last received NarPush's or EvalCacheChunk's frame
// back to the reader for the next one (session.Reader.Release): the
// handler keeps none of its Data.
func (s *Session) Release() { s.sess.Reader.Release() }

// Frame is the last received message's frame as it came, for a relay to
// another session (session.Reader.Frame); valid until Release.
func (s *Session) Frame() []byte { return s.sess.Reader.Frame() }

// Forget: another session's writer took the last frame over
// (session.Writer.Relay); the reader neither reuses nor recycles it.
func (s *Session) Forget() { s.sess.Reader.Forget() }

// Stopping reports whether the worker is stopping the session: it
// requests and accepts nothing more. Set before ClientDraining goes out.
func (s *Session) Stopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// run serves the session until it ends. Cancelling ctx stops the worker:
// Draining, the handler's Stop, close.
func (s *Session) run(ctx context.Context) sessionEnd {
	s.log.Info("session established", "authorized", s.sess.AuthorizedPeers, "failed_peers", len(s.sess.FailedPeers),
		"capabilities", capabilityNames(s.sess.Capabilities))
	s.start()
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			s.stop()
			close(stopped)
		case <-s.sess.Done():
		}
	}()
	go s.heartbeat()

	// The reader's context is the session's own: cancelling it would close
	// the socket before the stop sequence's reports went out.
	recvCtx, cancelRecv := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRecv()
	for {
		m, err := s.sess.Recv(recvCtx)
		if err != nil {
			break
		}
		s.dispatch(m)
	}
	s.mu.Lock()
	stopping, drained, refused := s.stopping, s.drained, s.refused
	s.mu.Unlock()
	reason := s.sess.Reason()
	if stopping {
		reason = "worker stopping"
	}
	s.h.Ended(reason)
	if stopping {
		<-stopped // the stop sequence may still wait for reports
		return endStopped
	}
	s.log.Info("session ended", "reason", s.sess.Reason())
	if refused {
		return endRefused
	}
	if drained {
		return endDrained
	}
	return endServed
}

// start sends WorkerCapabilities when the session may build, then the
// handler's part of the session-start sequence (docs/protocol/jobs.md §2).
func (s *Session) start() {
	if s.sess.Capabilities.Build {
		hw := s.sh.h.Host()
		s.send(&hw)
	}
	s.h.Start()
}

// sendHost re-sends what the worker reports of its host after it changed
// (Shell.HostChanged): the server schedules builds by WorkerCapabilities,
// so only a session that may build sends it, as start does.
func (s *Session) sendHost() {
	if s.sess.Capabilities.Build {
		hw := s.sh.h.Host()
		s.send(&hw)
	}
	s.send(s.sh.h.Load())
}

// heartbeat sends WorkerMetrics, then the handler's Tick (docs/protocol/jobs.md §12.1).
func (s *Session) heartbeat() {
	t := time.NewTicker(s.sh.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-s.sess.Done():
			return
		case <-t.C:
		}
		s.send(s.sh.h.Load())
		s.h.Tick()
	}
}

func (s *Session) send(m wire.ClientMessage) {
	if err := s.sess.Send(m); err != nil {
		s.log.Debug("send failed", "message", m.WireName(), "error", err)
	}
}

// dispatch answers the reauth exchange, marks a Draining or Reject and
// hands the handler every other message.
func (s *Session) dispatch(m wire.ServerMessage) {
	switch m := m.(type) {
	case *wire.AuthChallenge:
		// Answered here rather than by session.HandleAuth: the peers
		// file's `*` entry answers peers not listed explicitly.
		s.log.Info("server challenged the session", "peers", m.Peers)
		s.send(answerChallenge(s.sh.currentTokens(), m))
		return
	case *wire.ServerDraining:
		s.log.Info("server is draining: the session's jobs finish, then it reconnects")
		s.markDrained(false)
	case *wire.ServerReject:
		s.log.Warn("server refused the session", "code", m.Code, "reason", m.Reason)
		s.markDrained(s.sh.rejected(m.Code, m.Reason))
	}
	handled, err := session.HandleAuth(s.sess, s.auth, m)
	if handled {
		if err != nil {
			s.log.Warn("answering the server's auth failed", "error", err)
		} else if u, ok := m.(*wire.AuthUpdate); ok {
			s.log.Info("authorization updated", "authorized", u.AuthorizedPeers, "failed_peers", len(u.FailedPeers))
		}
		return
	}
	s.h.Handle(m)
}

// markDrained records a Draining or Reject; refused: OnRejected stops
// dialing.
func (s *Session) markDrained(refused bool) {
	s.mu.Lock()
	s.drained = true
	s.refused = s.refused || refused
	s.mu.Unlock()
}

// stop is the worker's stop sequence on this session (docs/protocol/jobs.md
// §12.3): Stopping, ClientDraining, the handler's Stop, then close
// (letting queued messages out).
func (s *Session) stop() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.send(&wire.ClientDraining{})
	s.h.Stop()
	s.sess.Close(session.CloseNormal, "worker stopping")
}

func capabilityNames(c wire.GradientCapabilities) []string {
	var out []string
	for _, f := range []struct {
		on   bool
		name string
	}{{c.Fetch, "fetch"}, {c.Eval, "eval"}, {c.Build, "build"}, {c.Federate, "federate"}} {
		if f.on {
			out = append(out, f.name)
		}
	}
	return out
}
