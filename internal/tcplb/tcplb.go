// Package tcplb is the tests' TCP load balancer: it listens on loopback
// and forwards each accepted connection to the next live backend, round
// robin, as the load balancer in front of several gradient-server
// instances would (README "Several instances"). A backend whose dial
// fails is skipped and the next one tried; bytes are copied both ways
// and both ends closed when either closes. Backends are added and
// removed while it runs; connections are counted per backend.
package tcplb

import (
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// dialTimeout bounds one backend's dial: a backend that does not answer
// is skipped like one that refuses.
const dialTimeout = 2 * time.Second

// LB is a running load balancer.
type LB struct {
	ln net.Listener

	mu       sync.Mutex
	backends []string
	next     int
	counts   map[string]int
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
	acceptWG sync.WaitGroup
}

// New listens on a free loopback port and forwards to backends
// (HOST:PORT each).
func New(backends ...string) (*LB, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	lb := &LB{ln: ln, backends: slices.Clone(backends), counts: map[string]int{}, conns: map[net.Conn]struct{}{}}
	lb.acceptWG.Add(1)
	go lb.accept()
	return lb, nil
}

// Addr is the address clients connect to (HOST:PORT).
func (lb *LB) Addr() string { return lb.ln.Addr().String() }

// Add adds a backend (a second Add of the same one changes nothing).
func (lb *LB) Add(backend string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if !slices.Contains(lb.backends, backend) {
		lb.backends = append(lb.backends, backend)
	}
}

// Remove takes a backend out of the rotation; its open connections go on.
func (lb *LB) Remove(backend string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.backends = slices.DeleteFunc(lb.backends, func(b string) bool { return b == backend })
}

// Backends are the backends in rotation.
func (lb *LB) Backends() []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return slices.Clone(lb.backends)
}

// Connections is how many connections were forwarded to each backend
// (all so far, open or closed).
func (lb *LB) Connections() map[string]int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := make(map[string]int, len(lb.counts))
	for b, n := range lb.counts {
		out[b] = n
	}
	return out
}

// Close stops accepting, closes every forwarded connection and waits
// for their copies to end.
func (lb *LB) Close() error {
	lb.mu.Lock()
	if lb.closed {
		lb.mu.Unlock()
		return nil
	}
	lb.closed = true
	err := lb.ln.Close()
	for c := range lb.conns {
		c.Close()
	}
	lb.mu.Unlock()
	lb.acceptWG.Wait()
	lb.wg.Wait()
	return err
}

func (lb *LB) accept() {
	defer lb.acceptWG.Done()
	for {
		c, err := lb.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: try again
			continue
		}
		if !lb.track(c) {
			c.Close()
			return
		}
		lb.wg.Add(1)
		go lb.forward(c)
	}
}

// track registers an open connection so Close can end it; false once
// closed.
func (lb *LB) track(c net.Conn) bool {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return false
	}
	lb.conns[c] = struct{}{}
	return true
}

func (lb *LB) untrack(c net.Conn) {
	lb.mu.Lock()
	delete(lb.conns, c)
	lb.mu.Unlock()
}

// candidates are the backends in the order this connection tries them:
// the rotation starting at the next one, which advances by one.
func (lb *LB) candidates() []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	n := len(lb.backends)
	if n == 0 {
		return nil
	}
	start := lb.next % n
	lb.next = (start + 1) % n
	return append(slices.Clone(lb.backends[start:]), lb.backends[:start]...)
}

// dial connects to the first candidate that answers and counts it.
func (lb *LB) dial() (net.Conn, bool) {
	for _, b := range lb.candidates() {
		c, err := net.DialTimeout("tcp", b, dialTimeout)
		if err != nil {
			continue
		}
		lb.mu.Lock()
		if lb.closed {
			lb.mu.Unlock()
			c.Close()
			return nil, false
		}
		lb.counts[b]++
		lb.conns[c] = struct{}{}
		lb.mu.Unlock()
		return c, true
	}
	return nil, false
}

func (lb *LB) forward(client net.Conn) {
	defer lb.wg.Done()
	defer lb.untrack(client)
	defer client.Close()
	backend, ok := lb.dial()
	if !ok {
		return // no live backend: the client sees its connection closed
	}
	defer lb.untrack(backend)
	defer backend.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		// Either side's end (EOF, reset) ends both: a load balancer that
		// half-closed would keep a dead server's sessions open.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(backend, client)
	go pipe(client, backend)
	<-done
	<-done
}
