package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

type openAuthority struct{}

func (openAuthority) Challenge(context.Context, string) ([]string, error) { return nil, nil }

func (openAuthority) Authorize(context.Context, string, []wire.Pair[string, string]) (handshake.Decision, error) {
	return handshake.Accept([]string{"peer"}, nil, handshake.AllCapabilities), nil
}

// TestRunConnectsAndStopsOnSignal runs the binary's entry point against a
// loopback authority: it connects, and the signal's context cancel makes
// it send Draining and return.
func TestRunConnectsAndStopsOnSignal(t *testing.T) {
	url, _, got := loopbackAuthority(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	metricsAddr := freeAddr(t)
	go func() {
		done <- run(ctx, []string{"--server-url", url, "--base-dir", t.TempDir(), "--capabilities-build", "true",
			"--system-cpu-core-score", "5", "--metrics-addr", metricsAddr}, func(string) string { return "" }, io.Discard)
	}()
	next := func() wire.ClientMessage {
		select {
		case m := <-got:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no message from the worker")
			return nil
		}
	}
	if caps, ok := next().(*wire.WorkerCapabilities); !ok || caps.CPUCoreScore != 5 {
		t.Fatalf("got %+v, want WorkerCapabilities", caps)
	}
	// The worker's series, on --metrics-addr, with the Go runtime's and
	// the process's.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"gradient_worker_connected 1\n", "gradient_worker_sessions_total 1\n", "\ngo_goroutines ", "\nprocess_cpu_seconds_total "} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}
	cancel()
	for {
		if _, ok := next().(*wire.ClientDraining); ok {
			break
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after the signal")
	}
}

// loopbackAuthority is a server on loopback offering every capability and
// allowing all: what a session negotiates is what the worker offered. It
// passes on each session's handshake result and every message received.
func loopbackAuthority(t *testing.T) (url string, sessions <-chan *session.Established, messages <-chan wire.ClientMessage) {
	t.Helper()
	got := make(chan wire.ClientMessage, 64)
	established := make(chan *session.Established, 4)
	discard := slog.New(slog.DiscardHandler)
	hs := httptest.NewServer(session.Handler(func(r *http.Request, tr session.Transport) {
		c := session.NewConn(tr, session.ConnOptions{Logger: discard})
		est, err := session.RunAuthority(r.Context(), c, session.AuthorityConfig{Policy: openAuthority{}})
		if err != nil {
			return
		}
		established <- est
		sess := session.SplitServer(c, est, session.Options{Logger: discard})
		for {
			m, err := sess.Recv(r.Context())
			if err != nil {
				return
			}
			got <- m
		}
	}))
	t.Cleanup(hs.Close)
	return "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto", established, got
}

// A worker started without capability flags offers fetch, eval and build,
// as the reference's defaults do, and not the reserved federate; the flag
// offers federate.
func TestDefaultCapabilitiesAreOffered(t *testing.T) {
	for _, c := range []struct {
		args []string
		want wire.GradientCapabilities
	}{
		{nil, wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}},
		{[]string{"--capabilities-federate=true", "--capabilities-eval=false"}, wire.GradientCapabilities{Fetch: true, Build: true, Federate: true}},
	} {
		url, sessions, _ := loopbackAuthority(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, append([]string{"--server-url", url, "--base-dir", t.TempDir(), "--system-cpu-core-score", "1"}, c.args...),
				func(string) string { return "" }, io.Discard)
		}()
		select {
		case est := <-sessions:
			got := est.Capabilities
			got.Core, got.Cache = false, false // the server's own
			if got != c.want {
				t.Errorf("%q: negotiated %+v, want %+v", c.args, got, c.want)
			}
		case err := <-done:
			t.Fatalf("%q: run returned before a session: %v", c.args, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%q: no session", c.args)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
	}
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
