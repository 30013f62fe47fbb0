package workersession

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

const testID = "0190a8f0-0000-7000-8000-000000000001"

// openPolicy accepts every worker for peer "peer".
type openPolicy struct{}

func (openPolicy) Challenge(context.Context, string) ([]string, error) { return []string{"peer"}, nil }

func (openPolicy) Authorize(context.Context, string, []wire.Pair[string, string]) (handshake.Decision, error) {
	return handshake.Accept([]string{"peer"}, nil, handshake.AllCapabilities), nil
}

// fakeServer is a protocol-level server: each session's messages go to
// its channel.
type fakeServer struct {
	url   string
	conns chan *fakeConn
}

type fakeConn struct {
	sess *session.ServerSession
	msgs chan wire.ClientMessage
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{conns: make(chan *fakeConn, 8)}
	quiet := slog.New(slog.DiscardHandler)
	hs := httptest.NewServer(session.Handler(func(r *http.Request, tr session.Transport) {
		c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
		est, err := session.RunAuthority(r.Context(), c, session.AuthorityConfig{Policy: openPolicy{}})
		if err != nil {
			return
		}
		fc := &fakeConn{sess: session.SplitServer(c, est, session.Options{Logger: quiet}), msgs: make(chan wire.ClientMessage, 256)}
		f.conns <- fc
		for {
			m, err := fc.sess.Recv(r.Context())
			if err != nil {
				close(fc.msgs)
				return
			}
			fc.msgs <- m
		}
	}))
	t.Cleanup(hs.Close)
	f.url = "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
	return f
}

func recv[T any](t *testing.T, what string, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// next is the session's next message other than WorkerMetrics.
func (c *fakeConn) next(t *testing.T) wire.ClientMessage {
	t.Helper()
	for {
		m, ok := <-c.msgs
		if !ok {
			t.Fatal("the session ended")
		}
		if _, hb := m.(*wire.WorkerMetrics); !hb {
			return m
		}
	}
}

// recorder is a Handler recording what its sessions were given, in order.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *recorder) has(e string) bool {
	for _, x := range r.got() {
		if x == e {
			return true
		}
	}
	return false
}

func (r *recorder) Host() wire.WorkerCapabilities {
	return wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, SystemFeatures: []string{}, MaxConcurrentBuilds: 2}
}
func (r *recorder) Load() *wire.WorkerMetrics    { return &wire.WorkerMetrics{} }
func (r *recorder) Open(*Session) SessionHandler { r.add("open"); return r }
func (r *recorder) Start()                       { r.add("start") }
func (r *recorder) Tick()                        {}
func (r *recorder) Stop()                        { r.add("stop") }
func (r *recorder) Ended(reason string)          { r.add("ended " + reason) }
func (r *recorder) Handle(m wire.ServerMessage)  { r.add(m.WireName()) }

func runShell(t *testing.T, cfg Config, h Handler) (stop func()) {
	t.Helper()
	cfg.WorkerID = testID
	cfg.Peers = "peer:" + strings.Repeat("ab", 32)
	cfg.Capabilities = wire.GradientCapabilities{Build: true}
	cfg.BackoffInitial, cfg.BackoffMax, cfg.Heartbeat = 20*time.Millisecond, 100*time.Millisecond, time.Hour
	cfg.Logger = slog.New(slog.DiscardHandler)
	sh, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := recv(t, "Run to return", done); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// The shell sends WorkerCapabilities before the handler's Start, answers
// the reauth exchange itself and hands the handler every other message,
// Draining included, in order.
func TestHandlerGetsTheSessionButTheReauth(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	h := &recorder{}
	runShell(t, Config{ServerURL: f.url}, h)
	c := recv(t, "a session", f.conns)
	if _, ok := c.next(t).(*wire.WorkerCapabilities); !ok {
		t.Fatal("the first message is not WorkerCapabilities")
	}
	c.sess.Send(&wire.AuthChallenge{Peers: []string{"peer"}})
	if _, ok := c.next(t).(*wire.AuthResponse); !ok {
		t.Fatal("the shell did not answer the AuthChallenge")
	}
	c.sess.Send(&wire.AbortJob{JobID: "j1", Reason: "r"})
	c.sess.Send(&wire.ServerDraining{})
	waitfor.True(t, "Draining at the handler", func() bool { return h.has("Draining") })
	want := []string{"open", "start", "AbortJob", "Draining"}
	if got := h.got(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("the handler got %v, want %v", got, want)
	}
}

// A Reject mid-session reaches OnRejected once and then the handler; a
// true answer ends the dialing, and the handler learns the session ended.
func TestRejectStopsDialingWhenOnRejectedSaysSo(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	h := &recorder{}
	var mu sync.Mutex
	var rejected []uint16
	runShell(t, Config{ServerURL: f.url, OnRejected: func(code uint16, _ string) bool {
		mu.Lock()
		defer mu.Unlock()
		rejected = append(rejected, code)
		return true
	}}, h)
	c := recv(t, "a session", f.conns)
	c.sess.Send(&wire.ServerReject{Code: 403, Reason: "deactivated"})
	waitfor.True(t, "Reject at the handler", func() bool { return h.has("Reject") })
	c.sess.Close(session.CloseNormal, "bye")
	waitfor.True(t, "the end at the handler", func() bool { return len(h.got()) == 4 })
	select {
	case <-f.conns:
		t.Fatal("the shell dialed again after OnRejected stopped it")
	case <-time.After(500 * time.Millisecond):
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rejected) != 1 || rejected[0] != 403 {
		t.Fatalf("OnRejected got %v, want one 403", rejected)
	}
}

// The stop: ClientDraining reaches the server before the handler's Stop
// runs, and the session ends as the worker stopping.
func TestStopDrainsThenStopsTheHandler(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	h := &recorder{}
	stop := runShell(t, Config{ServerURL: f.url}, h)
	c := recv(t, "a session", f.conns)
	c.next(t) // WorkerCapabilities
	stop()
	if _, ok := c.next(t).(*wire.ClientDraining); !ok {
		t.Fatal("the stop did not send ClientDraining first")
	}
	got := h.got()
	if len(got) != 4 || got[2] != "stop" || got[3] != "ended worker stopping" {
		t.Fatalf("the handler got %v, want Stop, then the end as the worker stopping", got)
	}
}
