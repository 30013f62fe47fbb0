package authority

import (
	"net/http"
	"sync"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/limit"
)

// ProtoHandler upgrades a worker's /proto request and serves its session
// (ServeWorker) after the limits: unauthenticated sockets are capped per
// IP and in all before they may take a session slot, so one client
// holding idle sockets locks no worker out.
func (a *Authority) ProtoHandler() http.Handler { return http.HandlerFunc(a.serveProto) }

func (a *Authority) serveProto(w http.ResponseWriter, r *http.Request) {
	handshakeDone, ok := a.admitHandshake(w, r)
	if !ok {
		return
	}
	defer handshakeDone()
	release, ok := a.TakeSlot()
	if !ok {
		http.Error(w, "too many connections", http.StatusServiceUnavailable)
		return
	}
	defer release()
	t, err := session.Accept(w, r)
	if err != nil {
		a.log.Warn("websocket upgrade failed", "remote", r.RemoteAddr, "error", err)
		return
	}
	defer t.Close(session.CloseNormal, "")
	a.serveWorker(t, r.RemoteAddr, handshakeDone)
}

// admitHandshake takes the pre-authentication permits of a /proto upgrade:
// one of the client IP's and one of all unauthenticated sessions'. done
// returns both; it may be called more than once.
func (a *Authority) admitHandshake(w http.ResponseWriter, r *http.Request) (done func(), ok bool) {
	releaseIP, ok := a.handshakesPerIP.TryAcquire(limit.ClientIP(r))
	if !ok {
		a.Refused("handshakes per IP")
		http.Error(w, "too many unauthenticated connections from this address", http.StatusServiceUnavailable)
		return nil, false
	}
	select {
	case a.handshakes <- struct{}{}:
	default:
		releaseIP()
		a.Refused("handshake limit")
		http.Error(w, "too many unauthenticated connections", http.StatusServiceUnavailable)
		return nil, false
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-a.handshakes
			releaseIP()
		})
	}, true
}
