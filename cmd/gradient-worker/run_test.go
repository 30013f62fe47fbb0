package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
		done <- run(ctx, nil, []string{"--server-url", url, "--base-dir", t.TempDir(), "--capabilities-build",
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
	return loopbackAuthorityWith(t, openAuthority{})
}

// loopbackAuthorityWith is loopbackAuthority deciding with policy.
func loopbackAuthorityWith(t *testing.T, policy session.Authority) (url string, sessions <-chan *session.Established, messages <-chan wire.ClientMessage) {
	t.Helper()
	got := make(chan wire.ClientMessage, 64)
	established := make(chan *session.Established, 4)
	discard := slog.New(slog.DiscardHandler)
	hs := httptest.NewServer(session.Handler(func(r *http.Request, tr session.Transport) {
		c := session.NewConn(tr, session.ConnOptions{Logger: discard})
		est, err := session.RunAuthority(r.Context(), c, session.AuthorityConfig{Policy: policy})
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
// offers federate. Its build slots, in the WorkerCapabilities the server
// schedules by, are the reference module's default 32 or the flag's.
func TestDefaultCapabilitiesAreOffered(t *testing.T) {
	for _, c := range []struct {
		args  []string
		want  wire.GradientCapabilities
		slots uint32
	}{
		{nil, wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}, 32},
		{[]string{"--capabilities-federate=true", "--capabilities-eval=false", "--build-max-concurrent", "3"},
			wire.GradientCapabilities{Fetch: true, Build: true, Federate: true}, 3},
	} {
		url, sessions, messages := loopbackAuthority(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, nil, append([]string{"--server-url", url, "--base-dir", t.TempDir(), "--system-cpu-core-score", "1"}, c.args...),
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
		select {
		case m := <-messages:
			if caps, ok := m.(*wire.WorkerCapabilities); !ok || caps.MaxConcurrentBuilds != c.slots {
				t.Errorf("%q: first message %+v, want WorkerCapabilities with %d build slots", c.args, m, c.slots)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q: no WorkerCapabilities", c.args)
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

// peerAuthority challenges for one peer and passes on the tokens the
// worker answers with.
type peerAuthority struct {
	peer   string
	tokens chan []wire.Pair[string, string]
}

func (a peerAuthority) Challenge(context.Context, string) ([]string, error) {
	return []string{a.peer}, nil
}

func (a peerAuthority) Authorize(_ context.Context, _ string, tokens []wire.Pair[string, string]) (handshake.Decision, error) {
	a.tokens <- tokens
	return handshake.Accept([]string{a.peer}, nil, handshake.AllCapabilities), nil
}

// A worker configured only through the reference's variable names (as its
// NixOS module does) answers the challenge from GRADIENT_WORKER_PEERS_FILE
// and offers what GRADIENT_WORKER_CAPABILITIES_* say.
func TestReferenceVariablesReachTheHandshake(t *testing.T) {
	token := strings.Repeat("7", handshake.PeerTokenLength)
	peersFile := filepath.Join(t.TempDir(), "peers")
	if err := os.WriteFile(peersFile, []byte("team-a:"+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	authority := peerAuthority{peer: "team-a", tokens: make(chan []wire.Pair[string, string], 4)}
	url, sessions, _ := loopbackAuthorityWith(t, authority)
	env := map[string]string{
		"GRADIENT_WORKER_SERVER_URL": url, "GRADIENT_WORKER_BASE_DIR": t.TempDir(), "GRADIENT_WORKER_PEERS_FILE": peersFile,
		"GRADIENT_WORKER_CAPABILITIES_BUILD": "false", "GRADIENT_WORKER_CAPABILITIES_FETCH": "true",
		"GRADIENT_WORKER_CAPABILITIES_EVAL": "true", "GRADIENT_WORKER_CAPABILITIES_FEDERATE": "false",
		"GRADIENT_WORKER_SYSTEM_CPU_CORE_SCORE": "1", "GRADIENT_WORKER_LOG_FORMAT": "json",
		"GRADIENT_WORKER_BUILD_MAX_CONCURRENT": "5", "GRADIENT_WORKER_DRAIN_TIMEOUT_SECS": "90",
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, nil, func(k string) string { return env[k] }, logs) }()
	select {
	case tokens := <-authority.tokens:
		if len(tokens) != 1 || tokens[0].First != "team-a" || tokens[0].Second != token {
			t.Errorf("the worker answered with %d tokens, want team-a's from the peers file", len(tokens))
		}
	case err := <-done:
		t.Fatalf("run returned before the handshake: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no handshake")
	}
	select {
	case est := <-sessions:
		got := est.Capabilities
		if got.Build || !got.Fetch || !got.Eval || got.Federate {
			t.Errorf("negotiated %+v, want fetch and eval without build", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no session")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The start-up line names the peers file, never its tokens.
	out := logs.String()
	if strings.Contains(out, token) {
		t.Errorf("a token appears in the log:\n%s", out)
	}
	var start map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "gradient-worker starting" {
			start = rec
		}
	}
	if start == nil || start["peers_file"] != peersFile || start["build_slots"] != 5.0 || start["drain_timeout"] != "1m30s" ||
		fmt.Sprint(start["capabilities"]) != "map[build:false eval:true federate:false fetch:true]" {
		t.Errorf("start-up line %v\nlog:\n%s", start, out)
	}
}

// syncBuffer collects a log written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
