package tcplb

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// echoServer answers each line with its name and the line, until closed.
type echoServer struct {
	name string
	ln   net.Listener
	mu   sync.Mutex
	cs   []net.Conn
}

func startEcho(t *testing.T, name string) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{name: name, ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.cs = append(s.cs, c)
			s.mu.Unlock()
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, s.name+" "+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(s.kill)
	return s
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

// kill closes the listener and every connection: the process died.
func (s *echoServer) kill() {
	s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cs {
		c.Close()
	}
}

func newLB(t *testing.T, backends ...string) *LB {
	t.Helper()
	lb, err := New(backends...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	return lb
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, lb *LB) *client {
	t.Helper()
	c, err := net.Dial("tcp", lb.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c: c, r: bufio.NewReader(c)}
}

// ask sends a line and returns the answer's backend name, or the error.
func (c *client) ask(msg string) (string, error) {
	c.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c.c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	name, rest, _ := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	if rest != msg {
		return "", io.ErrUnexpectedEOF
	}
	return name, nil
}

func (c *client) mustAsk(t *testing.T, msg string) string {
	t.Helper()
	name, err := c.ask(msg)
	if err != nil {
		t.Fatalf("ask %q: %v", msg, err)
	}
	return name
}

func TestRoundRobinAndCounts(t *testing.T) {
	a, b, c := startEcho(t, "a"), startEcho(t, "b"), startEcho(t, "c")
	lb := newLB(t, a.addr(), b.addr(), c.addr())
	var got []string
	for i := 0; i < 6; i++ {
		cl := dial(t, lb)
		got = append(got, cl.mustAsk(t, "hello"))
		// The same connection stays on its backend.
		if again := cl.mustAsk(t, "again"); again != got[i] {
			t.Errorf("connection %d moved from %s to %s", i, got[i], again)
		}
	}
	if s := strings.Join(got, ""); s != "abcabc" {
		t.Errorf("connections went to %s, want abcabc", s)
	}
	counts := lb.Connections()
	for _, s := range []*echoServer{a, b, c} {
		if counts[s.addr()] != 2 {
			t.Errorf("backend %s: %d connections, want 2 (%v)", s.name, counts[s.addr()], counts)
		}
	}
}

func TestDeadBackendSkippedAndItsConnectionsClosed(t *testing.T) {
	a, b := startEcho(t, "a"), startEcho(t, "b")
	lb := newLB(t, a.addr(), b.addr())
	onA := dial(t, lb)
	if name := onA.mustAsk(t, "x"); name != "a" {
		t.Fatalf("first connection on %s, want a", name)
	}
	a.kill()
	// The client of the dead backend sees its connection end.
	if _, err := onA.ask("after"); err == nil {
		t.Fatal("the connection to the killed backend still answers")
	}
	// Every new connection reaches the live one.
	for i := 0; i < 4; i++ {
		if name := dial(t, lb).mustAsk(t, "y"); name != "b" {
			t.Fatalf("connection %d after the kill went to %s", i, name)
		}
	}
	if n := lb.Connections()[b.addr()]; n != 4 {
		t.Errorf("b counted %d connections, want 4", n)
	}
}

func TestRemoveAndAdd(t *testing.T) {
	a, b := startEcho(t, "a"), startEcho(t, "b")
	lb := newLB(t, a.addr())
	held := dial(t, lb)
	held.mustAsk(t, "x")
	lb.Add(b.addr())
	lb.Add(b.addr())
	if got := lb.Backends(); len(got) != 2 {
		t.Fatalf("backends %v after adding b twice", got)
	}
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		seen[dial(t, lb).mustAsk(t, "y")] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("after Add, connections reached %v, want both", seen)
	}
	lb.Remove(a.addr())
	for i := 0; i < 3; i++ {
		if name := dial(t, lb).mustAsk(t, "z"); name != "b" {
			t.Fatalf("after Remove(a), a connection went to %s", name)
		}
	}
	// A removed backend's open connection goes on.
	if name := held.mustAsk(t, "still"); name != "a" {
		t.Errorf("held connection answered by %s", name)
	}
}

func TestNoBackendClosesClient(t *testing.T) {
	a := startEcho(t, "a")
	lb := newLB(t, a.addr())
	a.kill()
	if _, err := dial(t, lb).ask("x"); err == nil {
		t.Fatal("a connection with no live backend answered")
	}
}

func TestCloseEndsConnections(t *testing.T) {
	a := startEcho(t, "a")
	lb, err := New(a.addr())
	if err != nil {
		t.Fatal(err)
	}
	cl := dial(t, lb)
	cl.mustAsk(t, "x")
	done := make(chan error, 1)
	go func() { done <- lb.Close() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close hangs with an open connection")
	}
	if _, err := cl.ask("y"); err == nil {
		t.Error("a connection answered after Close")
	}
	if _, err := net.DialTimeout("tcp", lb.Addr(), time.Second); err == nil {
		t.Error("the closed load balancer still accepts")
	}
	if err := lb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
