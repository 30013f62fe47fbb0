package session

import (
	"errors"
	"fmt"
)

// Errors a send or receive can end with.
var (
	// ErrClosed: the connection or the writer task is gone, or version
	// agreement refused the peer (see Conn.Refusal).
	ErrClosed = errors.New("session closed")
	// ErrStalled: a writer lane stayed full for the whole send timeout
	// ("peer TCP stalled").
	ErrStalled = errors.New("peer TCP stalled")
)

// WebSocket close codes the session layer uses.
const (
	CloseNormal        = 1000
	CloseGoingAway     = 1001 // the endpoint is stopping (SIGTERM)
	CloseProtocolError = 1002
	ClosePolicy        = 1008
	// CloseTryAgainLater: an unauthenticated socket closed to make room
	// for a newer one.
	CloseTryAgainLater = 1013
)

// CloseError is the close frame the peer sent (or the transport reported).
type CloseError struct {
	Code   int
	Reason string
}

func (e *CloseError) Error() string {
	return fmt.Sprintf("connection closed (code %d): %s", e.Code, e.Reason)
}

// Is makes every CloseError match ErrClosed.
func (e *CloseError) Is(target error) bool { return target == ErrClosed }

// EncodeError is a message the agreed version cannot carry (for example a
// *wire.NewerThanPeerError); it is returned to the sender, never sent.
type EncodeError struct {
	Variant string
	Err     error
}

func (e *EncodeError) Error() string { return fmt.Sprintf("encode %s: %v", e.Variant, e.Err) }
func (e *EncodeError) Unwrap() error { return e.Err }

// ErrTooLarge: an encoded message exceeds MaxProtoMessageSize; the peer
// would close the connection on it, so it is refused before sending.
var ErrTooLarge = errors.New("message exceeds MAX_PROTO_MESSAGE_SIZE")

func checkSize(n int) error {
	if n > MaxProtoMessageSize {
		return fmt.Errorf("%w: %d bytes", ErrTooLarge, n)
	}
	return nil
}
