package hub_test

import (
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// A link shaper for the shaped benchmarks (docs/PERFORMANCE.md): a TCP
// relay on loopback that delivers each byte a fixed one-way delay after
// it was sent and no faster than a bandwidth cap, both ways. It stands in
// for a network, so the benchmarks can show the relay's cost where a
// network, not the two shared cores, bounds a transfer.
type link struct {
	delay time.Duration
	rate  float64 // bytes per second
}

// Links of a deployment: workers next to the proxy (LAN), the tenant's
// server far away (WAN). Directly connected workers cross the WAN link;
// workers behind the proxy cross the LAN link to it, and its upstream
// session the WAN link.
var (
	// The LAN's latency is the relay's own (a sleep this short would
	// overshoot on a loaded machine by far more than it models).
	lan = link{delay: 0, rate: 1.25e9}                   // 10 Gbit/s
	wan = link{delay: 5 * time.Millisecond, rate: 125e6} // 1 Gbit/s
)

// shape starts a shaper in front of the WebSocket URL u and returns the
// URL to dial instead.
func shape(b testing.TB, u string, l link) string {
	b.Helper()
	target, err := url.Parse(u)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	b.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target.Host)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { l.pipe(out, in) })
			wg.Go(func() { l.pipe(in, out) })
		}
	})
	shaped := *target
	shaped.Host = ln.Addr().String()
	return shaped.String()
}

type segment struct {
	data []byte
	at   time.Time
}

// pipe copies src to dst through the link: a reader timestamps what it
// reads, a writer holds it for the delay and paces it to the rate. At
// most about twice the bandwidth-delay product is in flight, so TCP's
// flow control still reaches the sender.
func (l link) pipe(dst, src net.Conn) {
	const seg = 16 << 10
	bdp := int(l.rate * l.delay.Seconds())
	q := make(chan segment, max(8, 2*bdp/seg))
	go func() {
		defer close(q)
		for {
			buf := make([]byte, seg)
			n, err := src.Read(buf)
			if n > 0 {
				q <- segment{buf[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	free := time.Now()
	for s := range q {
		due := s.at.Add(l.delay)
		if free.After(due) {
			due = free
		}
		// Sleeps shorter than this overshoot on a loaded machine; the
		// pacing catches up over the next segments instead.
		if d := time.Until(due); d > 200*time.Microsecond {
			time.Sleep(d)
		}
		if _, err := dst.Write(s.data); err != nil {
			break
		}
		free = due.Add(time.Duration(float64(len(s.data)) / l.rate * float64(time.Second)))
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	for range q { // unblock the reader until src ends
	}
}
