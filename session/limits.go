package session

import "time"

// Sizes and times of docs/protocol/wire.md §9, named as in the reference.
const (
	// MaxProtoMessageSize caps every WebSocket message in both directions,
	// on dialed and accepted sockets alike.
	MaxProtoMessageSize = 8 << 20
	// MaxHandshakeMessageSize caps every message received before the split.
	MaxHandshakeMessageSize = 64 << 10
	// BulkChunkSize is the payload of one bulk frame (NAR chunks).
	BulkChunkSize = 512 << 10
	// BulkBatchBytes stops a bulk write batch from filling further.
	BulkBatchBytes = 256 << 10
	// WriteBatch is the most messages one write batch holds, either lane.
	WriteBatch = 32
	// ControlLaneDepth and BulkLaneDepth are the writer's queue depths.
	ControlLaneDepth = 256
	BulkLaneDepth    = 16
)

const (
	// ConnectTimeout bounds a dial (TCP, TLS and the HTTP upgrade).
	ConnectTimeout = 10 * time.Second
	// HandshakeTimeout bounds version agreement plus the handshake.
	HandshakeTimeout = 15 * time.Second
	// HeartbeatTimeout is how long the server keeps a silent worker session.
	HeartbeatTimeout = 120 * time.Second
	// AckTimeout is how long a worker tolerates sent data the server has
	// not acknowledged (see ack.go).
	AckTimeout = 120 * time.Second
)
