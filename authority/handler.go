package authority

import (
	"net/http"
	"sync"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/limit"
)

// ProtoHandler upgrades a worker's /proto request and serves its session
// (ServeWorker) within the connection budget (limit.Budget): sockets that
// have not finished the handshake hold at most half of MaxConnections, at
// most HandshakesPerIP of them per address prefix, and past either limit
// the oldest unauthenticated socket is closed to admit the new one. So
// idle sockets from a few addresses lock no worker out.
func (a *Authority) ProtoHandler() http.Handler { return http.HandlerFunc(a.serveProto) }

func (a *Authority) serveProto(w http.ResponseWriter, r *http.Request) {
	sock := &shedSocket{}
	ticket, limitReached, ok := a.budget.Admit(limit.ClientIP(r), sock.shed)
	if !ok {
		a.Refused(limitReached)
		http.Error(w, "too many connections", http.StatusServiceUnavailable)
		return
	}
	defer ticket.Release()
	if limitReached != "" {
		a.metrics.shed.WithLabelValues(limitReached).Inc()
	}
	t, err := session.Accept(w, r)
	if err != nil {
		a.log.Warn("websocket upgrade failed", "remote", r.RemoteAddr, "error", err)
		return
	}
	defer t.Close(session.CloseNormal, "")
	if !sock.attach(t) {
		return // shed during the upgrade
	}
	a.serveWorker(t, r.RemoteAddr, ticket)
}

// shedReason is the close reason of a socket shed for a newer one.
const shedReason = "too many unauthenticated connections"

// shedSocket closes a /proto socket that the budget sheds, whether the
// shedding comes before or after its upgrade.
type shedSocket struct {
	mu     sync.Mutex
	t      session.Transport
	isShed bool
}

func (s *shedSocket) shed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.isShed = true
	if s.t != nil {
		// At once, without waiting for the peer's close frame: the
		// place goes to a newcomer and so must the file descriptor.
		session.Abandon(s.t, session.CloseTryAgainLater, shedReason)
	}
}

// attach hands the upgraded transport over; false (and closed) when the
// socket was shed already.
func (s *shedSocket) attach(t session.Transport) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.t = t
	if s.isShed {
		session.Abandon(t, session.CloseTryAgainLater, shedReason)
		return false
	}
	return true
}
