package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"gradient.dev/gradient/wire"
)

// Reader is the receiving half of a split session. It has a single owner
// (the dispatch loop). Each message is decoded from its own buffer, so
// decoded byte fields (NarPush.Data, LogChunk.Data, …) alias the received
// bytes and stay valid for as long as the caller keeps them.
type Reader[M wire.Message] struct {
	t     Transport
	ver   uint16
	codec Codec[M]
	log   *slog.Logger
	// last is the frame of the message Recv returned last, kept (with its
	// full capacity) so Release can hand it back to the buffer pool.
	last []byte
	// lastSeen is when the last message arrived (unix nanos), for the
	// heartbeat watchdog.
	lastSeen atomic.Int64
}

// NewReader reads messages of one direction at version ver.
func NewReader[M wire.Message](t Transport, ver uint16, codec Codec[M], log *slog.Logger) *Reader[M] {
	r := &Reader[M]{t: t, ver: ver, codec: codec, log: logger(log)}
	r.lastSeen.Store(time.Now().UnixNano())
	return r
}

// Version is the agreed protocol version.
func (r *Reader[M]) Version() uint16 { return r.ver }

// Recv returns the next message. Cancelling ctx while Recv waits closes
// the connection (the WebSocket library cannot abandon a read half-way), so
// pass the session's lifetime context, not a per-message deadline.
// Every end of stream (close frame,
// transport failure, undecodable message) is an error matching ErrClosed;
// an undecodable message is never skipped.
func (r *Reader[M]) Recv(ctx context.Context) (M, error) {
	var zero M
	frame, err := r.t.ReadMessage(ctx)
	r.last = frame
	if err != nil {
		return zero, err
	}
	r.lastSeen.Store(time.Now().UnixNano())
	// Capped at its length, the frame hides whatever a reused buffer holds
	// beyond this message from the decoded message.
	m, err := r.codec.Decode(frame[:len(frame):len(frame)], r.ver)
	if err != nil {
		r.log.Warn("undecodable message, ending session", "size", len(frame), "error", err)
		return zero, fmt.Errorf("%w: undecodable message: %w", ErrClosed, err)
	}
	return m, nil
}

// Release declares that the message Recv returned last, and every byte
// slice taken from it, is no longer used, so its buffer may receive the next
// message (of this session or another: buffers go to a shared, size-classed
// pool). Optional: without it no buffer of a message is ever reused. A
// dispatch loop that consumes bulk chunks synchronously (writes NarPush.Data
// to a file, then receives again) saves an allocation per chunk with it.
func (r *Reader[M]) Release() {
	putReadBuffer(r.last)
	r.last = nil
}

// Frame is the frame of the message Recv returned last, as received, for
// a Writer of the other leg to relay (Writer.Relay); valid until Release
// or the next Recv.
func (r *Reader[M]) Frame() []byte { return r.last }

// Forget gives the last frame up without recycling it: a Writer took it
// over (Writer.Relay) and recycles it once written. Release after Forget
// does nothing.
func (r *Reader[M]) Forget() { r.last = nil }

// idleFor is how long no message has arrived.
func (r *Reader[M]) idleFor(now time.Time) time.Duration {
	return now.Sub(time.Unix(0, r.lastSeen.Load()))
}
