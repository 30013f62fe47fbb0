package httpguard

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/internal/waitfor"
)

// long stands for "never" in a test: a timeout the test must not wait
// for, and a client's bound on waiting for the server to close.
const long = time.Hour

// serve runs h behind Server with the timeouts on loopback.
func serve(t *testing.T, h http.Handler, to Timeouts) (addr string, guarded *Listener) {
	return serveGuarded(t, h, to, nil)
}

// serveGuarded lets configure change the Listener before it serves.
func serveGuarded(t *testing.T, h http.Handler, to Timeouts, configure func(*Listener)) (addr string, guarded *Listener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	guarded = NewListener(ln, nil, log)
	if configure != nil {
		configure(guarded)
	}
	srv := Server(h, to, log)
	srv.ConnState = guarded.ConnState
	go srv.Serve(guarded)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), guarded
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reads until the server closes c; a client-side
// deadline far beyond the configured timeouts only keeps a broken test
// from hanging.
func closedByServer(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the server kept the connection open", what)
	}
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if _, err := io.ReadAll(r.Body); err != nil {
		http.Error(w, "body: "+err.Error(), http.StatusRequestTimeout)
		return
	}
	w.Write([]byte("ok\n"))
})

func TestIdleKeepAliveConnectionIsClosed(t *testing.T) {
	addr, _ := serve(t, ok, Timeouts{Header: long, Body: long, Idle: 50 * time.Millisecond})
	c := dial(t, addr)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("keep-alive request: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	closedByServer(t, c, "idle keep-alive connection")
}

func TestPostWithoutItsBodyIsClosed(t *testing.T) {
	addr, _ := serve(t, ok, Timeouts{Header: long, Body: 50 * time.Millisecond, Idle: long})
	c := dial(t, addr)
	if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part"); err != nil {
		t.Fatal(err)
	}
	closedByServer(t, c, "a POST whose body stalls")
}

func TestHalfSentHeadersAreClosed(t *testing.T) {
	addr, _ := serve(t, ok, Timeouts{Header: 50 * time.Millisecond, Body: long, Idle: long})
	c := dial(t, addr)
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	closedByServer(t, c, "half-sent headers")
}

// Near the file limit every accept closes the oldest connection that
// holds nothing, so a health check still gets in past idle clients; a
// request being served is left alone.
func TestListenerMakesRoomNearTheFileLimit(t *testing.T) {
	busy := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", ok)
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) { <-busy; w.Write([]byte("done")) })
	m, err := NewMetrics(prometheus.NewRegistry(), "test")
	if err != nil {
		t.Fatal(err)
	}
	var unauth atomic.Int32
	addr, guarded := serveGuarded(t, mux, Timeouts{Header: long, Body: long, Idle: long}, func(l *Listener) {
		// Every accepted descriptor counts as near the limit.
		l.limit, l.reserve = 1, 0
		l.shed, l.fileLimits, l.openGauge = m.shed, m.fileLimits, m.open
		l.ShedUnauthenticated = func() bool { unauth.Add(1); return false }
	})

	slow := dial(t, addr)
	io.WriteString(slow, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	waitfor.True(t, "the slow request in service", func() bool {
		guarded.mu.Lock()
		defer guarded.mu.Unlock()
		return guarded.open == 1 && guarded.waiting.Len() == 0
	})
	var idle []net.Conn
	for range 5 {
		idle = append(idle, dial(t, addr))
	}
	waitfor.True(t, "the idle connections accepted", func() bool { return testutil.ToFloat64(m.shed.WithLabelValues("new")) >= 4 })
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz past idle connections: %v %v", resp, err)
	}
	resp.Body.Close()
	closedByServer(t, idle[0], "the oldest idle connection")
	close(busy)
	slow.SetReadDeadline(time.Now().Add(time.Minute))
	sresp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil || sresp.StatusCode != http.StatusOK {
		t.Fatalf("the request in service was cut: %v %v", sresp, err)
	}
	if unauth.Load() == 0 {
		t.Fatal("with only a request in service left, no unauthenticated socket was asked for")
	}
}

func TestIsFileLimit(t *testing.T) {
	err := &net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", errEMFILE)}
	if !isFileLimit(err) {
		t.Fatal("EMFILE not recognised")
	}
	if isFileLimit(net.ErrClosed) {
		t.Fatal("a closed listener taken for the file limit")
	}
}
