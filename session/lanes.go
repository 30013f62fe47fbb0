package session

import "gradient.dev/gradient/wire"

// Lane is a writer queue.
type Lane uint8

const (
	ControlLane Lane = iota // replies and everything small; depth 256
	BulkLane                // payload streams; depth 16
)

func (l Lane) String() string {
	if l == BulkLane {
		return "bulk"
	}
	return "control"
}

// ClientLane is the lane of a worker→server message: payload chunks, and
// job-end reports that must not overtake the log chunks queued before them,
// ride the bulk lane (wire's bulk annotation).
func ClientLane(m wire.ClientMessage) Lane {
	if wire.ClientMessageBulk(m) {
		return BulkLane
	}
	return ControlLane
}

// ServerLane is the lane of a server→worker message: a transfer stream's
// header, chunks and terminal messages stay in order on the bulk lane
// (wire's bulk annotation).
func ServerLane(m wire.ServerMessage) Lane {
	if wire.ServerMessageBulk(m) {
		return BulkLane
	}
	return ControlLane
}

// Codec binds a message direction to its encoder, decoder and lane rule, so
// one generic Reader and Writer serve both sides.
type Codec[M wire.Message] struct {
	Append func(dst []byte, m M, ver uint16) ([]byte, error)
	Decode func(frame []byte, ver uint16) (M, error)
	Lane   func(m M) Lane
	// SameEncoding: the variant tag encodes alike at two versions, so a
	// received frame may be relayed unchanged (Writer.Relay).
	SameEncoding func(tag uint64, a, b uint16) bool
}

// ClientCodec carries worker→server messages.
var ClientCodec = Codec[wire.ClientMessage]{
	Append: wire.AppendClientMessage, Decode: wire.DecodeClientMessage, Lane: ClientLane,
	SameEncoding: wire.SameClientEncoding,
}

// ServerCodec carries server→worker messages.
var ServerCodec = Codec[wire.ServerMessage]{
	Append: wire.AppendServerMessage, Decode: wire.DecodeServerMessage, Lane: ServerLane,
	SameEncoding: wire.SameServerEncoding,
}
