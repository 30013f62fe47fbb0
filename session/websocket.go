package session

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/coder/websocket"
)

// wsTransport is a Transport over a coder/websocket connection.
type wsTransport struct {
	c *websocket.Conn
	// bigHint remembers the size of the last large message, so a stream of
	// 512 KiB chunks reads each chunk straight into a buffer that fits.
	bigHint int
}

// NewWebSocketTransport wraps an established connection, applying the
// 8 MiB message cap. Dial and Accept already call it.
func NewWebSocketTransport(c *websocket.Conn) Transport {
	c.SetReadLimit(MaxProtoMessageSize)
	return &wsTransport{c: c}
}

// firstRead is how much of a message is read before its size is guessed:
// control messages fit, bulk messages move this prefix once.
const firstRead = 1024

func (t *wsTransport) ReadMessage(ctx context.Context) ([]byte, error) {
	for {
		typ, r, err := t.c.Reader(ctx)
		if err != nil {
			return nil, t.mapErr(err)
		}
		if typ != websocket.MessageBinary {
			if err := discard(r); err != nil {
				return nil, t.mapErr(err)
			}
			continue
		}
		buf, err := t.readAll(r)
		if err != nil {
			return nil, t.mapErr(err)
		}
		return buf, nil
	}
}

// discard consumes a skipped (text) message: the library reads the next
// header from wherever the previous reader stopped.
func discard(r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	return err
}

// ReadMessageInto is ReadMessage reading into buf's backing array (grown
// if the message does not fit): for a reader whose caller released buf.
func (t *wsTransport) ReadMessageInto(ctx context.Context, buf []byte) ([]byte, error) {
	for {
		typ, r, err := t.c.Reader(ctx)
		if err != nil {
			return nil, t.mapErr(err)
		}
		if typ != websocket.MessageBinary {
			if err := discard(r); err != nil {
				return nil, t.mapErr(err)
			}
			continue
		}
		buf = buf[:0]
		for {
			if len(buf) == cap(buf) {
				buf = append(buf, 0)[:len(buf)]
			}
			n, err := r.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err == io.EOF {
				return buf, nil
			}
			if err != nil {
				return nil, t.mapErr(err)
			}
		}
	}
}

// readAll reads one message into a fresh buffer. Small messages land in a
// 1 KiB buffer; larger ones get a buffer sized from the last large message,
// so payload bytes are read once into the buffer the decoder slices.
func (t *wsTransport) readAll(r io.Reader) ([]byte, error) {
	small := make([]byte, firstRead)
	n, err := io.ReadFull(r, small)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return small[:n:n], nil
	case err != nil:
		return nil, err
	}
	size := max(t.bigHint+firstRead, 4*firstRead)
	buf := make([]byte, firstRead, size)
	copy(buf, small)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			t.bigHint = len(buf)
			if len(buf) < cap(buf)/4 {
				// After a much larger message the guess overshot; keep
				// the oversized buffer from living as long as this one.
				buf = append([]byte(nil), buf...)
			}
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (t *wsTransport) WriteMessage(ctx context.Context, p []byte) error {
	if err := t.c.Write(ctx, websocket.MessageBinary, p); err != nil {
		return t.mapErr(err)
	}
	return nil
}

func (t *wsTransport) Close(code int, reason string) error {
	return t.c.Close(websocket.StatusCode(code), clipReason(reason))
}

func (t *wsTransport) Ping(ctx context.Context) error { return t.c.Ping(ctx) }

// mapErr turns library errors into the session's: a close frame becomes a
// *CloseError; everything else (EOF, a cancelled context, the 8 MiB limit,
// a reset) wraps ErrClosed and keeps the cause.
func (t *wsTransport) mapErr(err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return &CloseError{Code: int(ce.Code), Reason: ce.Reason}
	}
	return fmt.Errorf("%w: %w", ErrClosed, err)
}
