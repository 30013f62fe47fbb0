package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"gradient.dev/gradient/wire"
)

// ConnOptions configure a Conn. The zero value speaks wire.Supported and
// logs to slog.Default().
type ConnOptions struct {
	// Versions is this side's range; zero means wire.Supported. Tests use
	// other ranges.
	Versions wire.VersionRange
	Logger   *slog.Logger
}

// Conn is the unsplit socket used for version agreement and the handshake
// (the reference's ProtoSocket). Agreement happens lazily on the first send
// or receive: send our version frame, read the peer's, apply wire.Agree.
// A Conn has a single owner; it is not safe for concurrent use.
type Conn struct {
	t       Transport
	ours    wire.VersionRange
	log     *slog.Logger
	agreed  bool
	ver     uint16
	refusal string
	dead    error // set once agreement refused or the transport failed
	shut    bool  // a close was started; the first reason is the one sent
}

// shutdown starts closing with code and reason unless a close was already
// started (the first reason, e.g. an oversize message, is the true one).
func (c *Conn) shutdown(code int, reason string) {
	if c.shut {
		return
	}
	c.shut = true
	closeAsync(c.t, code, reason)
}

// NewConn wraps a transport that has not yet agreed on a version.
func NewConn(t Transport, opts ConnOptions) *Conn {
	ours := opts.Versions
	if ours == (wire.VersionRange{}) {
		ours = wire.Supported
	}
	return &Conn{t: t, ours: ours, log: logger(opts.Logger)}
}

// Version is the agreed version, 0 before agreement.
func (c *Conn) Version() uint16 { return c.ver }

// Refusal is why agreement refused the peer ("" if it did not); a dialing
// server keeps it as the worker's offline reason.
func (c *Conn) Refusal() string { return c.refusal }

// Versions is this side's supported range.
func (c *Conn) Versions() wire.VersionRange { return c.ours }

// Transport is the underlying transport (for Close, or to split).
func (c *Conn) Transport() Transport { return c.t }

// Close closes the transport with code and reason.
func (c *Conn) Close(code int, reason string) error { return c.t.Close(code, reason) }

// Agree runs version agreement if it has not run yet. A refusal closes the
// socket with 1002 and the reason, logs it at warn, and is returned as an
// error matching ErrClosed that wraps a *wire.RefusalError.
func (c *Conn) Agree(ctx context.Context) (uint16, error) {
	if c.agreed {
		return c.ver, nil
	}
	if c.dead != nil {
		return 0, c.dead
	}
	if err := c.t.WriteMessage(ctx, wire.VersionFrame(c.ours)); err != nil {
		return 0, err
	}
	frame, err := c.t.ReadMessage(ctx)
	if err != nil {
		return 0, err
	}
	ver, err := wire.Agree(c.ours, frame)
	if err != nil {
		var refusal *wire.RefusalError
		errors.As(err, &refusal)
		c.refusal = refusal.Reason
		c.log.Warn("protocol version refused", "reason", c.refusal)
		c.dead = fmt.Errorf("%w: %w", ErrClosed, err)
		c.shutdown(CloseProtocolError, c.refusal)
		return 0, c.dead
	}
	c.agreed, c.ver = true, ver
	return ver, nil
}

// SendServer encodes m at the agreed version and sends it.
func (c *Conn) SendServer(ctx context.Context, m wire.ServerMessage) error {
	return c.send(ctx, m, func(ver uint16) ([]byte, error) { return wire.AppendServerMessage(nil, m, ver) })
}

// SendClient encodes m at the agreed version and sends it.
func (c *Conn) SendClient(ctx context.Context, m wire.ClientMessage) error {
	return c.send(ctx, m, func(ver uint16) ([]byte, error) { return wire.AppendClientMessage(nil, m, ver) })
}

func (c *Conn) send(ctx context.Context, m wire.Message, encode func(uint16) ([]byte, error)) error {
	ver, err := c.Agree(ctx)
	if err != nil {
		return err
	}
	b, err := encode(ver)
	if err == nil {
		err = checkSize(len(b))
	}
	if err != nil {
		return &EncodeError{Variant: m.WireName(), Err: err}
	}
	c.log.Debug("handshake send", "message", m.WireName())
	return c.t.WriteMessage(ctx, b)
}

// OversizeError is a handshake message over MaxHandshakeMessageSize; the
// connection has been closed with 1002 without decoding it.
type OversizeError struct{ Size int }

func (e *OversizeError) Error() string {
	return fmt.Sprintf("a handshake message is limited to %d bytes, got %d", MaxHandshakeMessageSize, e.Size)
}

// recvFrame agrees if needed and reads one handshake message, enforcing the
// handshake size cap before anything looks at the bytes.
func (c *Conn) recvFrame(ctx context.Context) ([]byte, error) {
	if _, err := c.Agree(ctx); err != nil {
		return nil, err
	}
	frame, err := c.t.ReadMessage(ctx)
	if err != nil {
		return nil, err
	}
	if len(frame) > MaxHandshakeMessageSize {
		oe := &OversizeError{Size: len(frame)}
		c.log.Warn("handshake message too large", "size", len(frame))
		c.shutdown(CloseProtocolError, oe.Error())
		return nil, oe
	}
	return frame, nil
}

// MalformedError is a handshake message that did not decode.
type MalformedError struct{ Err error }

func (e *MalformedError) Error() string { return "malformed message: " + e.Err.Error() }
func (e *MalformedError) Unwrap() error { return e.Err }

// RecvClient reads one ClientMessage during the handshake (server side). An
// undecodable message is answered with Error{400, "malformed message"}.
func (c *Conn) RecvClient(ctx context.Context) (wire.ClientMessage, error) {
	frame, err := c.recvFrame(ctx)
	if err != nil {
		return nil, err
	}
	m, err := wire.DecodeClientMessage(frame, c.ver)
	if err != nil {
		c.log.Warn("undecodable handshake message", "error", err)
		c.SendError(ctx, 400, "malformed message")
		return nil, &MalformedError{Err: err}
	}
	c.log.Debug("handshake receive", "message", m.WireName())
	return m, nil
}

// RecvServer reads one ServerMessage during the handshake (worker side).
func (c *Conn) RecvServer(ctx context.Context) (wire.ServerMessage, error) {
	frame, err := c.recvFrame(ctx)
	if err != nil {
		return nil, err
	}
	m, err := wire.DecodeServerMessage(frame, c.ver)
	if err != nil {
		c.log.Warn("undecodable handshake message", "error", err)
		return nil, &MalformedError{Err: err}
	}
	c.log.Debug("handshake receive", "message", m.WireName())
	return m, nil
}

// SendReject sends a server Reject, ignoring failures (the session ends
// either way).
func (c *Conn) SendReject(ctx context.Context, code uint16, reason string) {
	_ = c.SendServer(ctx, &wire.ServerReject{Code: code, Reason: reason})
}

// SendClientReject sends a worker's Reject, ignoring failures.
func (c *Conn) SendClientReject(ctx context.Context, code uint16, reason string) {
	_ = c.SendClient(ctx, &wire.ClientReject{Code: code, Reason: reason})
}

// SendError sends a server Error, ignoring failures.
func (c *Conn) SendError(ctx context.Context, code uint16, message string) {
	_ = c.SendServer(ctx, &wire.ServerError{Code: code, Message: message})
}
