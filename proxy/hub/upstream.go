package hub

import "gradient.dev/gradient/wire"

// Upstream is the tenant's upstream session as the hub serves it, a
// workersession.SessionHandler: proxy/upstream attaches one per session
// its shell establishes and hands it the session's messages.
type Upstream struct {
	h      *Hub
	id     uint64
	frames Frames
}

// Frames is the upstream session's reader as the hub relays its bulk
// chunks (workersession.Session): the received frames of NarPush and
// EvalCacheChunk go to the worker as they came, not decoded and encoded
// again, where the hub forwards them unchanged.
type Frames interface {
	// Version is the upstream session's agreed protocol version.
	Version() uint16
	// Frame is the last received message's frame.
	Frame() []byte
	// Release hands the frame back to the reader for the next one: the
	// hub keeps nothing of it.
	Release()
	// Forget: a worker's writer took the frame over.
	Forget()
}

// Attach makes send the tenant's upstream session; frames, when set, is
// its reader, whose NarPush and EvalCacheChunk frames the hub relays or
// hands back.
func (h *Hub) Attach(send func(wire.ClientMessage) error, frames Frames) *Upstream {
	return &Upstream{h: h, id: h.attach(send), frames: frames}
}

func (u *Upstream) Start() {} // the hub polls (attach)
func (u *Upstream) Tick()  {} // the hub polls for its waiting workers
func (u *Upstream) Stop()  {} // the jobs run behind the proxy: detach aborts them

// Handle takes one message of the upstream session, in order.
func (u *Upstream) Handle(m wire.ServerMessage) {
	switch m.(type) {
	case *wire.NarPush, *wire.EvalCacheChunk:
		if u.frames == nil {
			u.h.fromUpstream(u.id, m, nil)
			return
		}
		in := &upstreamFrame{frame: u.frames.Frame(), ver: u.frames.Version()}
		u.h.fromUpstream(u.id, m, in)
		if in.taken {
			u.frames.Forget()
		} else {
			u.frames.Release() // the hub is done with the chunk: its frame takes the next
		}
	default:
		u.h.fromUpstream(u.id, m, nil)
	}
}

// Ended: the upstream session is gone; its jobs behind the proxy are
// aborted and the tenant's workers closed (detach).
func (u *Upstream) Ended(reason string) { u.h.detach(u.id, reason) }

// upstreamFrame is the frame an upstream message was decoded from, at the
// upstream session's version; taken once a worker's writer took it over.
type upstreamFrame struct {
	frame []byte
	ver   uint16
	taken bool
}

// Relayer is a Downstream that can send a received frame as it came
// (Outbox.Relay); the hub sends other Downstreams the message.
type Relayer interface {
	// Relay queues m for the worker from frame, the upstream frame it
	// was decoded from at version ver, and reports whether it took the
	// frame over (then neither frame nor m's byte fields are read again).
	Relay(m wire.ServerMessage, frame []byte, ver uint16) bool
}
