package hub

import "gradient.dev/gradient/wire"

// Upstream is the tenant's upstream session as the hub serves it, a
// workersession.SessionHandler: proxy/upstream attaches one per session
// its shell establishes and hands it the session's messages.
type Upstream struct {
	h       *Hub
	id      uint64
	release func()
}

// Attach makes send the tenant's upstream session; release, when set,
// hands a relayed NarPush's or EvalCacheChunk's frame back to the
// session's reader (workersession.Session.Release) once the hub is done
// with it.
func (h *Hub) Attach(send func(wire.ClientMessage) error, release func()) *Upstream {
	return &Upstream{h: h, id: h.attach(send), release: release}
}

func (u *Upstream) Start() {} // the hub polls (attach)
func (u *Upstream) Tick()  {} // the hub polls for its waiting workers
func (u *Upstream) Stop()  {} // the jobs run behind the proxy: detach aborts them

// Handle takes one message of the upstream session, in order.
func (u *Upstream) Handle(m wire.ServerMessage) {
	u.h.fromUpstream(u.id, m)
	switch m.(type) {
	case *wire.NarPush, *wire.EvalCacheChunk:
		// The hub is done with the chunk: its frame takes the next.
		if u.release != nil {
			u.release()
		}
	}
}

// Ended: the upstream session is gone; its jobs behind the proxy are
// aborted and the tenant's workers closed (detach).
func (u *Upstream) Ended(reason string) { u.h.detach(u.id, reason) }
