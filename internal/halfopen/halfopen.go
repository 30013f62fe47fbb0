// Package halfopen gives tests a TCP proxy whose connections can die
// half-open: after Freeze they stay open on both sides but carry nothing,
// as when a peer vanished without a FIN or RST.
package halfopen

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards every connection to a target until Freeze; connections
// accepted after a Freeze are forwarded again.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen chan struct{} // closed by the next Freeze
	conns  []net.Conn
}

// New listens on loopback and forwards to target (host:port) until the
// test ends.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, frozen: make(chan struct{})}
	tb.Cleanup(p.close)
	go p.serve()
	return p
}

// Addr is where the proxy listens.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Freeze stops every connection open now: both ends stay open and
// whatever either side sends is swallowed.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.frozen)
	p.frozen = make(chan struct{})
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *Proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		frozen := p.frozen
		p.mu.Unlock()
		go forward(out, in, frozen)
		go forward(in, out, frozen)
	}
}

// forward copies src to dst until frozen is closed, then stops reading
// and leaves both connections open.
func forward(dst, src net.Conn, frozen <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-frozen:
			return
		default:
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err == io.EOF {
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}
		if err != nil {
			return
		}
	}
}
