package session

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"time"
)

// Coalescing limits: frames up to coalesceFrame bytes are gathered while a
// batch is written, up to coalesceBytes, then sent with one write system
// call. Larger frames (bulk chunks) go straight through, so no payload is
// copied once more.
const (
	coalesceFrame = 8 << 10
	coalesceBytes = 64 << 10
)

var coalescePool = sync.Pool{New: func() any { b := make([]byte, 0, coalesceBytes); return &b }}

// coalescingConn sits between gorilla and the socket. While the writer
// task writes a batch (corked), the small frames gorilla writes are
// gathered; the batch's last message is written uncorked and takes what
// was gathered with it, so a batch of control messages costs one write
// system call (and the peer one read) instead of one per message. Every
// socket write thus happens inside one of gorilla's frame writes, under
// gorilla's write lock, so a close frame or a ping still gives up after its
// deadline when a data write is stuck on a peer that stopped reading.
// Frames written with a deadline (close, pong, a ping with a deadline) send
// what is gathered and go out at once, so a close frame is on the socket
// when WriteControl returns.
type coalescingConn struct {
	net.Conn

	mu       sync.Mutex
	corked   bool
	buf      *[]byte   // gathered frames, from coalescePool while corked
	deadline time.Time // the write deadline gorilla set last
	err      error     // a failed flush: the stream is broken
}

func (c *coalescingConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	return c.Conn.SetWriteDeadline(t)
}

func (c *coalescingConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	return c.Conn.SetDeadline(t)
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	gathering := c.buf != nil && len(*c.buf) > 0
	if c.deadline.IsZero() && len(p) <= coalesceFrame && (c.corked || gathering) {
		if c.buf == nil {
			c.buf = coalescePool.Get().(*[]byte)
		}
		if len(*c.buf)+len(p) <= coalesceBytes {
			*c.buf = append(*c.buf, p...)
			if c.corked {
				return len(p), nil
			}
			// Uncorked: the batch's last frame takes the others along.
			return len(p), c.flushLocked()
		}
	}
	if err := c.flushLocked(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// cork starts gathering small frames.
func (c *coalescingConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// last stops gathering: the next frame written takes what was gathered
// with it. Call it before writing a batch's last message.
func (c *coalescingConn) last() {
	c.mu.Lock()
	c.corked = false
	c.mu.Unlock()
}

// done ends a batch. Normally nothing is left (the last message took it);
// after a failed write the gathered frames are still sent if the stream
// is intact, as gorilla considers them written.
func (c *coalescingConn) done() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	err := c.flushLocked()
	if c.buf != nil {
		*c.buf = (*c.buf)[:0]
		coalescePool.Put(c.buf)
		c.buf = nil
	}
	return err
}

func (c *coalescingConn) flushLocked() error {
	if c.err != nil {
		return c.err
	}
	if c.buf == nil || len(*c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(*c.buf)
	*c.buf = (*c.buf)[:0]
	if err != nil {
		c.err = err
	}
	return err
}

// hijackCoalescing is a ResponseWriter whose Hijack hands gorilla the
// socket wrapped in a coalescingConn, so accepted connections gather
// their frames too.
type hijackCoalescing struct {
	http.ResponseWriter
	conn *coalescingConn
}

func (h *hijackCoalescing) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	nc, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	h.conn = &coalescingConn{Conn: nc}
	return h.conn, brw, nil
}

// coalescerOf finds the coalescingConn under a gorilla connection's
// socket, beneath TLS if any.
func coalescerOf(nc net.Conn) *coalescingConn {
	if tc, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = tc.NetConn()
	}
	cc, _ := nc.(*coalescingConn)
	return cc
}
