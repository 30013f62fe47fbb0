package session

import (
	"context"
	"fmt"
	"sync"
)

// Pipe returns two connected in-memory transports: what one writes the
// other reads. It exists so handshakes and lanes can be exercised (and
// fuzzed) without sockets; production code always uses Dial or Accept.
func Pipe() (Transport, Transport) {
	ab := newPipeHalf()
	ba := newPipeHalf()
	return &pipeEnd{in: ba, out: ab}, &pipeEnd{in: ab, out: ba}
}

// pipeHalf is one direction: unbounded queue plus the close frame.
type pipeHalf struct {
	mu     sync.Mutex
	queue  [][]byte
	closed *CloseError
	wake   chan struct{}
}

func newPipeHalf() *pipeHalf { return &pipeHalf{wake: make(chan struct{}, 1)} }

func (h *pipeHalf) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

type pipeEnd struct {
	in, out *pipeHalf
}

func (p *pipeEnd) ReadMessage(ctx context.Context) ([]byte, error) {
	for {
		p.in.mu.Lock()
		if len(p.in.queue) > 0 {
			m := p.in.queue[0]
			p.in.queue = p.in.queue[1:]
			p.in.mu.Unlock()
			return m, nil
		}
		closed := p.in.closed
		p.in.mu.Unlock()
		if closed != nil {
			return nil, closed
		}
		select {
		case <-p.in.wake:
		case <-ctx.Done():
			p.Close(ClosePolicy, "read timed out")
			return nil, fmt.Errorf("%w: %w", ErrClosed, ctx.Err())
		}
	}
}

func (p *pipeEnd) WriteMessage(ctx context.Context, b []byte) error {
	p.out.mu.Lock()
	defer p.out.mu.Unlock()
	if p.out.closed != nil {
		return fmt.Errorf("%w: write after close", ErrClosed)
	}
	p.out.queue = append(p.out.queue, append([]byte(nil), b...))
	p.out.signal()
	return nil
}

func (p *pipeEnd) Close(code int, reason string) error {
	ce := &CloseError{Code: code, Reason: clipReason(reason)}
	for _, h := range []*pipeHalf{p.out, p.in} {
		h.mu.Lock()
		if h.closed == nil {
			h.closed = ce
		}
		h.mu.Unlock()
		h.signal()
	}
	return nil
}

// startClose closes at once: a pipe has no close handshake to wait for.
func (p *pipeEnd) startClose(code int, reason string, _ bool) { p.Close(code, reason) }
