package session

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// Buffer sizes of the gorilla connections (see docs/WEBSOCKET.md).
const (
	// readBufferSize is the bufio.Reader in front of the socket. Frame
	// headers and small messages go through it; a large payload read into
	// a larger buffer bypasses it.
	readBufferSize = 4 << 10
	// clientWriteBufferSize is where a dialed (client) connection masks
	// its frames: gorilla copies each message through it, masking, and
	// writes one frame per buffer. 64 KiB measured best (16 KiB to 520 KiB
	// tried): the masked bytes are still in cache when the kernel copies
	// them, and a 512 KiB chunk costs 9 write system calls, not coder's 128.
	clientWriteBufferSize = 64 << 10
	// serverWriteBufferSize is the accepted side's: a server frame is not
	// masked, so gorilla copies only the first writeBuf of a message and
	// hands the rest to writev unchanged; small is best.
	serverWriteBufferSize = 8 << 10
	// closeWait bounds the close handshake (our close frame out, the
	// peer's back) before the socket is closed regardless.
	closeWait = 5 * time.Second
	// controlWriteWait bounds writing a close frame.
	controlWriteWait = time.Second
)

// Write buffers are held only while a message is being written: an idle
// connection holds none.
var clientWritePool, serverWritePool sync.Pool

// wsTransport is a Transport over a gorilla/websocket connection. gorilla
// allows one reader and one writer at a time; WriteControl (pings, close)
// may run concurrently with both. The locks below enforce the rule for
// every caller of the Transport.
type wsTransport struct {
	c *websocket.Conn
	// rsem is the read lock (a channel so Close can wait for it with a
	// timeout); wmu the write lock. Lock order (docs/LOCKS.md): wmu →
	// writes' cancelWatch.mu, → closeMu (a write whose context ended
	// claims the close), → co's mu (the socket write).
	rsem chan struct{}
	wmu  sync.Mutex
	// bigHint remembers the size of the last large message, so a stream of
	// 512 KiB chunks reads each chunk straight into a buffer that fits.
	bigHint int
	probe   [1]byte
	// reads and writes close the connection when the context of the
	// operation in progress ends.
	reads, writes cancelWatch
	// co gathers the frames of a batch into one write (nil if the socket
	// was not set up by Dial or Accept).
	co *coalescingConn

	// The first close claimed (Close, closeAsync, a dropped session, a
	// cancelled read or write) decides the code and reason the peer sees;
	// every later one only waits for the socket to be released.
	closeMu    sync.Mutex
	claimed    bool
	closed     chan struct{} // closed once a close was claimed
	released   chan struct{} // closed once the socket is closed
	closeErr   error         // why the close frame did not go out, valid after released
	peerClosed chan struct{} // closed once the peer's close frame was read
	peerOnce   sync.Once

	pingSeq atomic.Uint64
	pingMu  sync.Mutex
	pings   map[uint64]chan struct{}
}

// NewWebSocketTransport wraps an established connection, applying the
// 8 MiB message cap. Dial and Accept already call it.
func NewWebSocketTransport(c *websocket.Conn) Transport {
	c.SetReadLimit(MaxProtoMessageSize)
	t := &wsTransport{
		c:          c,
		rsem:       make(chan struct{}, 1),
		closed:     make(chan struct{}),
		released:   make(chan struct{}),
		peerClosed: make(chan struct{}),
	}
	t.co = coalescerOf(c.NetConn())
	t.reads.onCancel = t.closeCancelled
	t.writes.onCancel = t.closeCancelled
	c.SetPongHandler(t.pong)
	return t
}

// SetReadLimit lowers the message cap to n bytes (see LimitMessageSize).
func (t *wsTransport) SetReadLimit(n int64) { t.c.SetReadLimit(n) }

// readFailed maps a read error. After gorilla refused an oversized
// message (a frame header took it past the limit) it has sent 1009 and
// stopped reading mid-message. Closing the socket with the peer's bytes
// unread would reset the connection, and a reset can destroy the close
// frame before the peer reads it; so the rest is discarded until the peer
// closes, at most closeWait.
func (t *wsTransport) readFailed(ctx context.Context, err error) error {
	if errors.Is(err, websocket.ErrReadLimit) {
		nc := t.c.NetConn()
		nc.SetReadDeadline(time.Now().Add(closeWait))
		io.Copy(io.Discard, nc)
	}
	return t.mapErr(ctx, err)
}

// firstRead is how much of a message is read before its size is guessed:
// control messages fit, bulk messages move this prefix once.
const firstRead = 1024

var scratchPool = sync.Pool{New: func() any { return new([firstRead]byte) }}

// closeCancelled closes the connection because ctx ended under a read or
// write, sending the close frame first unless a close was claimed
// already. A cancelled ctx is this side going away (1001, with the cancel
// cause as the reason, e.g. "server stopping"); a deadline means the peer
// did not answer in time (1008), so its close is not waited for.
func (t *wsTransport) closeCancelled(ctx context.Context) {
	code, reason, awaitPeer := CloseGoingAway, "going away", true
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		code, reason, awaitPeer = ClosePolicy, "timed out", false
	}
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		reason = cause.Error()
	}
	t.startClose(code, reason, awaitPeer)
}

func (t *wsTransport) ReadMessage(ctx context.Context) ([]byte, error) {
	select {
	case t.rsem <- struct{}{}:
	case <-ctx.Done():
		t.closeCancelled(ctx)
		return nil, fmt.Errorf("%w: %w", ErrClosed, ctx.Err())
	}
	defer func() { <-t.rsem }()
	if !t.reads.begin(ctx) {
		return nil, fmt.Errorf("%w: %w", ErrClosed, ctx.Err())
	}
	defer t.reads.end()
	for {
		typ, r, err := t.c.NextReader()
		if err != nil {
			return nil, t.readFailed(ctx, err)
		}
		if typ != websocket.BinaryMessage {
			// The next NextReader discards the rest of a text message.
			continue
		}
		buf, err := t.readAll(r)
		if err != nil {
			return nil, t.readFailed(ctx, err)
		}
		return buf, nil
	}
}

// readAll reads one message. Small messages land in a fresh buffer of their size;
// larger ones in a pooled buffer (see getReadBuffer) sized from the last
// large message, so payload bytes are read once, straight from the socket,
// into the buffer the decoder slices.
func (t *wsTransport) readAll(r io.Reader) ([]byte, error) {
	// The prefix lands in a pooled scratch array (taken only once a
	// message arrives, so an idle session holds none); a small message gets
	// a buffer of its exact size, so a 100-byte reply allocates 100 bytes,
	// not 1 KiB.
	scratch := scratchPool.Get().(*[firstRead]byte)
	defer scratchPool.Put(scratch)
	small := scratch[:]
	n, err := io.ReadFull(r, small)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		exact := make([]byte, n)
		copy(exact, small)
		return exact, nil
	case err != nil:
		return nil, err
	}
	buf := getReadBuffer(max(t.bigHint, 4*firstRead))[:firstRead]
	copy(buf, small)
	for {
		if len(buf) == cap(buf) {
			// Full: either the message ends exactly here or it needs a
			// larger class.
			m, err := r.Read(t.probe[:])
			if m == 0 && err == io.EOF {
				break
			}
			if err != nil && err != io.EOF {
				putReadBuffer(buf)
				return nil, err
			}
			bigger := getReadBuffer(2 * cap(buf))[:len(buf)]
			copy(bigger, buf)
			putReadBuffer(buf)
			buf = append(bigger, t.probe[:m]...)
			if err == io.EOF {
				break
			}
			continue
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			break
		}
		if err != nil {
			putReadBuffer(buf)
			return nil, err
		}
	}
	t.bigHint = len(buf)
	if len(buf) < cap(buf)/4 {
		// After a much larger message the guess overshot; keep the
		// oversized buffer from living as long as this one.
		exact := append([]byte(nil), buf...)
		putReadBuffer(buf)
		return exact, nil
	}
	return buf, nil
}

func (t *wsTransport) WriteMessage(ctx context.Context, p []byte) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if !t.writes.begin(ctx) {
		return fmt.Errorf("%w: %w", ErrClosed, ctx.Err())
	}
	err := t.c.WriteMessage(websocket.BinaryMessage, p)
	t.writes.end()
	if err != nil {
		return t.mapErr(ctx, err)
	}
	return nil
}

// WriteMessages sends each of batch as one binary message, like
// WriteMessage in turn, but gathers the small ones into as few write
// system calls as fit (see coalescingConn); they are on the socket when it
// returns. It stops at the first error.
func (t *wsTransport) WriteMessages(ctx context.Context, batch [][]byte) error {
	if t.co == nil || len(batch) == 1 {
		for _, p := range batch {
			if err := t.WriteMessage(ctx, p); err != nil {
				return err
			}
		}
		return nil
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if !t.writes.begin(ctx) {
		return fmt.Errorf("%w: %w", ErrClosed, ctx.Err())
	}
	defer t.writes.end()
	t.co.cork()
	for i, p := range batch {
		if i == len(batch)-1 {
			t.co.last()
		}
		if err := t.c.WriteMessage(websocket.BinaryMessage, p); err != nil {
			t.co.done()
			return t.mapErr(ctx, err)
		}
	}
	if err := t.co.done(); err != nil {
		return t.mapErr(ctx, err)
	}
	return nil
}

// Close sends the close frame, waits (at most closeWait) for the peer's,
// and closes the socket. A reader that is running sees the peer's close
// frame itself; otherwise Close reads until it arrives. If a close was
// claimed already, Close keeps its code and reason and waits for it to
// release the socket.
func (t *wsTransport) Close(code int, reason string) error {
	if t.claim() {
		t.finishClose(code, reason, true)
	}
	<-t.released
	return t.closeErr
}

// startClose claims the close for code and reason at once and finishes it
// in the background. awaitPeer false skips the wait for the peer's close
// frame: the peer is known not to answer.
func (t *wsTransport) startClose(code int, reason string, awaitPeer bool) {
	if t.claim() {
		go t.finishClose(code, reason, awaitPeer)
	}
}

// claim reports whether this is the first close.
func (t *wsTransport) claim() bool {
	t.closeMu.Lock()
	defer t.closeMu.Unlock()
	if t.claimed {
		return false
	}
	t.claimed = true
	close(t.closed)
	return true
}

// finishClose writes and flushes the close frame, waits for the peer's if
// asked, and only then closes the socket.
func (t *wsTransport) finishClose(code int, reason string, awaitPeer bool) {
	defer close(t.released)
	defer t.writes.release()
	defer t.reads.release()
	defer t.c.Close()
	msg := websocket.FormatCloseMessage(code, clipReason(reason))
	if err := t.c.WriteControl(websocket.CloseMessage, msg, time.Now().Add(controlWriteWait)); err != nil {
		if !errors.Is(err, websocket.ErrCloseSent) { // else the peer's close was answered already
			t.closeErr = err
		}
		return
	}
	if !awaitPeer {
		return
	}
	timer := time.NewTimer(closeWait)
	defer timer.Stop()
	select {
	case t.rsem <- struct{}{}:
		t.c.SetReadDeadline(time.Now().Add(closeWait))
		for {
			if _, _, err := t.c.NextReader(); err != nil {
				break
			}
		}
		<-t.rsem
	case <-t.peerClosed:
	case <-timer.C:
	}
}

// Ping sends a ping and waits for its pong: the peer answers only after
// its reader consumed everything written before the ping.
func (t *wsTransport) Ping(ctx context.Context) error {
	seq := t.pingSeq.Add(1)
	done := make(chan struct{})
	t.pingMu.Lock()
	if t.pings == nil {
		t.pings = make(map[uint64]chan struct{})
	}
	t.pings[seq] = done
	t.pingMu.Unlock()
	defer func() {
		t.pingMu.Lock()
		delete(t.pings, seq)
		t.pingMu.Unlock()
	}()
	var payload [8]byte
	binary.BigEndian.PutUint64(payload[:], seq)
	deadline, _ := ctx.Deadline()
	if err := t.c.WriteControl(websocket.PingMessage, payload[:], deadline); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return t.mapErr(ctx, err)
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.closed:
		return fmt.Errorf("%w: closed while pinging", ErrClosed)
	}
}

// pong runs on the reader's goroutine for every pong received.
func (t *wsTransport) pong(data string) error {
	if len(data) != 8 {
		return nil
	}
	seq := binary.BigEndian.Uint64([]byte(data))
	t.pingMu.Lock()
	if done, ok := t.pings[seq]; ok {
		close(done)
		delete(t.pings, seq)
	}
	t.pingMu.Unlock()
	return nil
}

// mapErr turns library errors into the session's: a close frame becomes a
// *CloseError; everything else (EOF, a cancelled context, the 8 MiB limit,
// a reset) wraps ErrClosed and keeps the cause.
func (t *wsTransport) mapErr(ctx context.Context, err error) error {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		t.peerOnce.Do(func() { close(t.peerClosed) })
		return &CloseError{Code: ce.Code, Reason: ce.Text}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w (%w)", ErrClosed, ctx.Err(), err)
	}
	return fmt.Errorf("%w: %w", ErrClosed, err)
}
