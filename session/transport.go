package session

import "context"

// Transport moves whole protocol messages: one binary WebSocket message per
// protocol message. The handshake, the reader and the writer only see this
// interface, so they run unchanged over a WebSocket or an in-memory pipe.
type Transport interface {
	// ReadMessage returns the next binary message in a buffer of its own
	// that the transport never touches again (decoded byte fields alias it)
	// unless the caller hands it back through Reader.Release.
	// Non-binary messages are skipped. A close from the peer is a
	// *CloseError; any other end is an error matching ErrClosed.
	ReadMessage(ctx context.Context) ([]byte, error)
	// WriteMessage sends p as one binary message. p may be reused after it
	// returns.
	WriteMessage(ctx context.Context, p []byte) error
	// Close sends a close frame with code and reason and releases the
	// connection. The first close decides the code and reason; closing
	// again is harmless and keeps them.
	Close(code int, reason string) error
}

// pinger is implemented by transports that can prove the peer has read
// everything sent so far (a WebSocket ping answered by a pong).
type pinger interface {
	Ping(ctx context.Context) error
}

// readLimiter is implemented by transports that refuse an oversized
// message before reading it.
type readLimiter interface {
	SetReadLimit(n int64)
}

// LimitMessageSize lowers the largest message t accepts to n bytes. A
// WebSocket refuses a larger message as soon as its frame header arrives,
// before the payload is read or buffered, and closes the connection with
// 1009 (message too big). Call it between reads: after the handshake,
// before the split. Transports without a limit (in-memory pipes) ignore it.
func LimitMessageSize(t Transport, n int) {
	if l, ok := t.(readLimiter); ok {
		l.SetReadLimit(int64(n))
	}
}

// maxCloseReason is the longest reason a close frame carries (RFC 6455:
// 125 payload bytes minus the 2-byte code).
const maxCloseReason = 123

func clipReason(reason string) string {
	if len(reason) > maxCloseReason {
		return reason[:maxCloseReason]
	}
	return reason
}

// closeStarter is a transport whose close handshake takes time:
// startClose claims the close for code and reason at once (a later Close
// cannot replace them) and finishes it in the background.
type closeStarter interface {
	startClose(code int, reason string, awaitPeer bool)
}

// closeAsync closes t without waiting: a WebSocket close handshake waits
// (up to seconds) for the peer's close frame, and nobody needs that answer.
// The code and reason are decided before it returns, so a Close that
// follows (a handler's deferred one) cannot overwrite them.
func closeAsync(t Transport, code int, reason string) {
	startClose(t, code, reason, true)
}

// Abandon closes t with code and reason at once, without waiting for the
// peer's close frame: the connection is dropped to free its place (and
// file descriptor) for another.
func Abandon(t Transport, code int, reason string) { abandon(t, code, reason) }

// abandon closes t with code and reason without waiting for the peer's
// close frame: the peer stopped answering.
func abandon(t Transport, code int, reason string) {
	startClose(t, code, reason, false)
}

func startClose(t Transport, code int, reason string, awaitPeer bool) {
	if cs, ok := t.(closeStarter); ok {
		cs.startClose(code, reason, awaitPeer)
		return
	}
	go t.Close(code, reason)
}
