package session

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

var workerCaps = wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}

func runAuthorityPeer(t *testing.T, policy *testPolicy, tokens map[string]string) (server, worker result) {
	t.Helper()
	a, d := loopback(t)
	srv := goRun(func() (*Established, error) {
		return RunAuthority(context.Background(), NewConn(a, quiet()), AuthorityConfig{Policy: policy})
	})
	wrk := goRun(func() (*Established, error) {
		return RunPeer(context.Background(), NewConn(d, quiet()), PeerConfig{WorkerID: "w1", Capabilities: workerCaps, Tokens: tokens})
	})
	return wait(t, srv), wait(t, wrk)
}

func TestAuthorityAndPeer(t *testing.T) {
	policy := &testPolicy{peers: []string{"p1", "p2"}, valid: map[string]string{"p1": "t1", "p2": "t2"}, allowed: handshake.AllCapabilities}
	server, worker := runAuthorityPeer(t, policy, map[string]string{"p1": "t1", "p2": "wrong", "p9": "x"})
	if server.err != nil || worker.err != nil {
		t.Fatalf("server %v, worker %v", server.err, worker.err)
	}
	if server.est.WorkerID != "w1" || worker.est.Version != wire.NewestVersion {
		t.Fatalf("server %+v worker %+v", server.est, worker.est)
	}
	if !slices.Equal(worker.est.AuthorizedPeers, []string{"p1"}) ||
		len(worker.est.FailedPeers) != 1 || worker.est.FailedPeers[0] != (wire.FailedPeer{PeerID: "p2", Reason: "invalid token"}) {
		t.Fatalf("worker peers %v %v", worker.est.AuthorizedPeers, worker.est.FailedPeers)
	}
	want := wire.GradientCapabilities{Core: true, Cache: true, Fetch: true, Eval: true, Build: true}
	if worker.est.Capabilities != want || server.est.Capabilities != want {
		t.Fatalf("capabilities %+v / %+v, want %+v", worker.est.Capabilities, server.est.Capabilities, want)
	}
}

func TestAuthorityRejects(t *testing.T) {
	cases := []struct {
		name   string
		policy *testPolicy
		tokens map[string]string
		code   uint16
		reason string
	}{
		{"no valid token", &testPolicy{peers: []string{"p1"}, valid: map[string]string{"p1": "t1"}}, map[string]string{"p1": "bad"}, 401, "no valid peer tokens provided"},
		{"unknown worker", &testPolicy{reject: &handshake.UnknownWorker}, nil, 403, "unknown worker"},
		{"deactivated", &testPolicy{reject: &handshake.WorkerDeactivated}, nil, 403, "worker is deactivated"},
		{"no cache", &testPolicy{reject: &handshake.NoCacheSubscribed}, nil, 495, "project has no cache subscribed"},
		{"duplicate", &testPolicy{reject: &handshake.AlreadyConnected}, nil, 496, "worker already connected"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			server, worker := runAuthorityPeer(t, tc.policy, tc.tokens)
			for side, err := range map[string]error{"server": server.err, "worker": worker.err} {
				var he *handshake.Error
				if !errors.As(err, &he) || he.Code != tc.code || he.Reason != tc.reason || he.WorkerID != "w1" {
					t.Fatalf("%s: %v, want %d %q for w1", side, err, tc.code, tc.reason)
				}
			}
			if !strings.HasPrefix(worker.err.Error(), "server rejected connection (code ") {
				t.Fatalf("worker error text %q", worker.err)
			}
		})
	}
}

// rawWorker agrees on a version over the dialed end and then speaks raw
// frames, for the wrong-message cases.
func rawWorker(t *testing.T) (*Conn, *Conn) {
	a, d := loopback(t)
	return NewConn(a, quiet()), NewConn(d, quiet())
}

func startAuthority(server *Conn, policy *testPolicy) <-chan result {
	return goRun(func() (*Established, error) {
		return RunAuthority(context.Background(), server, AuthorityConfig{Policy: policy})
	})
}

func wantHandshakeError(t *testing.T, err error, code uint16, reason string) {
	t.Helper()
	var he *handshake.Error
	if !errors.As(err, &he) || he.Code != code || he.Reason != reason {
		t.Fatalf("got %v, want %d %q", err, code, reason)
	}
}

func TestAuthorityWrongFirstMessage(t *testing.T) {
	server, worker := rawWorker(t)
	res := startAuthority(server, &testPolicy{})
	ctx := context.Background()
	if err := worker.SendClient(ctx, &wire.AuthResponse{}); err != nil {
		t.Fatal(err)
	}
	m, err := worker.RecvServer(ctx)
	if r, ok := m.(*wire.ServerReject); err != nil || !ok || r.Code != 400 || r.Reason != "expected InitConnection" {
		t.Fatalf("got %#v %v", m, err)
	}
	wantHandshakeError(t, wait(t, res).err, 400, "expected InitConnection")
}

func TestAuthorityWrongSecondMessage(t *testing.T) {
	server, worker := rawWorker(t)
	res := startAuthority(server, &testPolicy{peers: []string{"p1"}})
	ctx := context.Background()
	worker.SendClient(ctx, &wire.InitConnection{ID: "w7"})
	if m, err := worker.RecvServer(ctx); err != nil {
		t.Fatal(err)
	} else if _, ok := m.(*wire.AuthChallenge); !ok {
		t.Fatalf("got %#v", m)
	}
	worker.SendClient(ctx, &wire.ClientDraining{})
	m, _ := worker.RecvServer(ctx)
	if r, ok := m.(*wire.ServerReject); !ok || r.Code != 400 || r.Reason != "expected AuthResponse" {
		t.Fatalf("got %#v", m)
	}
	err := wait(t, res).err
	wantHandshakeError(t, err, 400, "expected AuthResponse")
	var he *handshake.Error
	errors.As(err, &he)
	if he.WorkerID != "w7" {
		t.Fatalf("claimed id %q", he.WorkerID)
	}
}

func TestAuthorityMalformedMessage(t *testing.T) {
	server, worker := rawWorker(t)
	res := startAuthority(server, &testPolicy{})
	ctx := context.Background()
	if _, err := worker.Agree(ctx); err != nil {
		t.Fatal(err)
	}
	worker.Transport().WriteMessage(ctx, []byte{0xff, 0xff, 0xff})
	m, err := worker.RecvServer(ctx)
	if e, ok := m.(*wire.ServerError); err != nil || !ok || e.Code != 400 || e.Message != "malformed message" {
		t.Fatalf("got %#v %v", m, err)
	}
	wantHandshakeError(t, wait(t, res).err, 0, "connection closed before InitConnection")
}

func TestAuthorityOversizedHandshakeMessage(t *testing.T) {
	server, worker := rawWorker(t)
	res := startAuthority(server, &testPolicy{})
	ctx := context.Background()
	huge := strings.Repeat("w", 64<<10)
	if err := worker.SendClient(ctx, &wire.InitConnection{ID: huge}); err != nil {
		t.Fatal(err)
	}
	_, err := worker.Transport().ReadMessage(ctx)
	var ce *CloseError
	size := len(huge) + 1 + 6 + 3 // tag, capabilities, varint length
	want := "a handshake message is limited to 65536 bytes, got " + itoa(size)
	if !errors.As(err, &ce) || ce.Code != 1002 || ce.Reason != want {
		t.Fatalf("got %v, want close 1002 %q", err, want)
	}
	err = wait(t, res).err
	var oe *OversizeError
	if !errors.As(err, &oe) {
		t.Fatalf("authority error %v", err)
	}
}

func itoa(n int) string {
	b := []byte{}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func runDialerDialed(t *testing.T, dialID, ownID string, serverTokens []wire.Pair[string, string], verifier ServerVerifier, policy *testPolicy) (server, worker result) {
	t.Helper()
	a, d := loopback(t)
	// The server dials: its end is the dialed transport.
	srv := goRun(func() (*Established, error) {
		return RunDialer(context.Background(), NewConn(d, quiet()), DialerConfig{WorkerID: dialID, Tokens: serverTokens, Policy: policy})
	})
	wrk := goRun(func() (*Established, error) {
		return RunDialed(context.Background(), NewConn(a, quiet()), DialedConfig{WorkerID: ownID, Capabilities: workerCaps, Verifier: verifier})
	})
	return wait(t, srv), wait(t, wrk)
}

func TestDialerAndDialed(t *testing.T) {
	tokens := []wire.Pair[string, string]{{First: "p1", Second: "s1"}}
	policy := &testPolicy{peers: []string{"p1"}, allowed: wire.GradientCapabilities{Build: true}}
	server, worker := runDialerDialed(t, "w1", "w1", tokens, tokenSet{"p1": "s1"}, policy)
	if server.err != nil || worker.err != nil {
		t.Fatalf("server %v worker %v", server.err, worker.err)
	}
	if server.est.WorkerID != "w1" || server.est.Version != wire.NewestVersion || !server.est.Capabilities.Build || server.est.Capabilities.Eval {
		t.Fatalf("dialer result %+v", server.est)
	}
	if !slices.Equal(worker.est.AuthorizedPeers, []string{"p1"}) {
		t.Fatalf("dialed result %+v", worker.est)
	}
}

func TestDialedRejectsWrongToken(t *testing.T) {
	a, d := loopback(t)
	wrk := goRun(func() (*Established, error) {
		return RunDialed(context.Background(), NewConn(a, quiet()), DialedConfig{WorkerID: "w1", Verifier: tokenSet{"p1": "s1"}})
	})
	server := NewConn(d, quiet())
	ctx := context.Background()
	server.SendServer(ctx, &wire.Authenticate{WorkerID: "w1", Tokens: []wire.Pair[string, string]{{First: "p1", Second: "nope"}}})
	m, err := server.RecvClient(ctx)
	if r, ok := m.(*wire.ClientReject); err != nil || !ok || r.Code != 401 || r.Reason != "unknown worker id or wrong token" {
		t.Fatalf("got %#v %v", m, err)
	}
	if m, err := server.RecvClient(ctx); err == nil {
		t.Fatalf("a second message arrived: %#v", m)
	}
	wantHandshakeError(t, wait(t, wrk).err, 401, "unknown worker id or wrong token")
}

func TestDialerReachesAnotherWorker(t *testing.T) {
	server, worker := runDialerDialed(t, "w1", "w2", nil, nil, &testPolicy{})
	wantHandshakeError(t, server.err, 401, "unknown worker id or wrong token")
	wantHandshakeError(t, worker.err, 401, "unknown worker id or wrong token")
}

func TestDialerWorkerAnswersAsOther(t *testing.T) {
	a, d := loopback(t)
	srv := goRun(func() (*Established, error) {
		return RunDialer(context.Background(), NewConn(d, quiet()), DialerConfig{WorkerID: "w1", Policy: &testPolicy{}})
	})
	worker := NewConn(a, quiet())
	ctx := context.Background()
	if m, err := worker.RecvServer(ctx); err != nil {
		t.Fatal(err)
	} else if _, ok := m.(*wire.Authenticate); !ok {
		t.Fatalf("got %#v", m)
	}
	worker.SendClient(ctx, &wire.InitConnection{ID: "w3"})
	m, _ := worker.RecvServer(ctx)
	if r, ok := m.(*wire.ServerReject); !ok || r.Code != 400 || r.Reason != "dialed worker answered as w3" {
		t.Fatalf("got %#v", m)
	}
	wantHandshakeError(t, wait(t, srv).err, 400, "dialed worker answered as w3")
}

func TestDialerAdmissionRejected(t *testing.T) {
	server, worker := runDialerDialed(t, "w1", "w1", nil, nil, &testPolicy{reject: &handshake.WorkerDeactivated})
	wantHandshakeError(t, server.err, 403, "worker is deactivated")
	wantHandshakeError(t, worker.err, 403, "worker is deactivated")
}

func TestDialedWrongFirstMessage(t *testing.T) {
	a, d := loopback(t)
	wrk := goRun(func() (*Established, error) {
		return RunDialed(context.Background(), NewConn(a, quiet()), DialedConfig{WorkerID: "w1"})
	})
	server := NewConn(d, quiet())
	ctx := context.Background()
	server.SendServer(ctx, &wire.ServerDraining{})
	m, _ := server.RecvClient(ctx)
	if r, ok := m.(*wire.ClientReject); !ok || r.Code != 400 || r.Reason != "expected Authenticate" {
		t.Fatalf("got %#v", m)
	}
	wantHandshakeError(t, wait(t, wrk).err, 400, "expected Authenticate")
}

func TestPeerVersionMismatch(t *testing.T) {
	a, d := loopback(t)
	srv := goRun(func() (*Established, error) {
		c := NewConn(a, ConnOptions{Versions: wire.VersionRange{Oldest: 34, Newest: 35}, Logger: discardLogger()})
		return RunAuthority(context.Background(), c, AuthorityConfig{Policy: &testPolicy{}})
	})
	wc := NewConn(d, quiet())
	wrk := goRun(func() (*Established, error) {
		return RunPeer(context.Background(), wc, PeerConfig{WorkerID: "w1"})
	})
	s, w := wait(t, srv), wait(t, wrk)
	wantHandshakeError(t, w.err, 0, "no shared protocol version: ours 30..=33, peer 34..=35")
	wantHandshakeError(t, s.err, 0, "no shared protocol version: ours 34..=35, peer 30..=33")
	if wc.Refusal() != "no shared protocol version: ours 30..=33, peer 34..=35" {
		t.Fatalf("refusal %q", wc.Refusal())
	}
}

func TestDialerKeepsRefusal(t *testing.T) {
	a, d := loopback(t)
	dc := NewConn(d, quiet())
	srv := goRun(func() (*Established, error) {
		return RunDialer(context.Background(), dc, DialerConfig{WorkerID: "w1", Policy: &testPolicy{}})
	})
	wrk := goRun(func() (*Established, error) {
		c := NewConn(a, ConnOptions{Versions: wire.VersionRange{Oldest: 20, Newest: 29}, Logger: discardLogger()})
		return RunDialed(context.Background(), c, DialedConfig{WorkerID: "w1"})
	})
	s, _ := wait(t, srv), wait(t, wrk)
	want := "no shared protocol version: ours 30..=33, peer 20..=29"
	wantHandshakeError(t, s.err, 0, want)
	if dc.Refusal() != want {
		t.Fatalf("offline reason %q", dc.Refusal())
	}
}

func TestListenerClassifiesFirstMessage(t *testing.T) {
	// A server dials a listener that classifies the first message itself.
	a, d := loopback(t)
	srv := goRun(func() (*Established, error) {
		return RunDialer(context.Background(), NewConn(d, quiet()), DialerConfig{
			WorkerID: "w1", Tokens: []wire.Pair[string, string]{{First: "p1", Second: "s1"}}, Policy: &testPolicy{peers: []string{"p1"}},
		})
	})
	listener := NewConn(a, quiet())
	first, err := listener.RecvFirst(context.Background())
	if err != nil || first.Kind != FromServer {
		t.Fatalf("classified %+v %v", first, err)
	}
	est, err := RunDialedAuthenticated(context.Background(), listener, DialedConfig{WorkerID: "w1", Verifier: tokenSet{"p1": "s1"}}, first.Auth)
	if err != nil || !slices.Equal(est.AuthorizedPeers, []string{"p1"}) {
		t.Fatalf("dialed %+v %v", est, err)
	}
	if r := wait(t, srv); r.err != nil {
		t.Fatal(r.err)
	}

	// A worker dials the same kind of listener.
	a, d = loopback(t)
	wrk := goRun(func() (*Established, error) {
		return RunPeer(context.Background(), NewConn(d, quiet()), PeerConfig{WorkerID: "w5", Tokens: map[string]string{}})
	})
	listener = NewConn(a, quiet())
	first, err = listener.RecvFirst(context.Background())
	if err != nil || first.Kind != FromWorker || first.Init.ID != "w5" {
		t.Fatalf("classified %+v %v", first, err)
	}
	if _, err := RunAuthorityGreeted(context.Background(), listener, AuthorityConfig{Policy: &testPolicy{}}, first.Init); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, wrk); r.err != nil {
		t.Fatal(r.err)
	}
}

func TestClassifyFirst(t *testing.T) {
	ver := wire.NewestVersion
	enc := func(m wire.ClientMessage) []byte { b, _ := wire.AppendClientMessage(nil, m, ver); return b }
	encS := func(m wire.ServerMessage) []byte { b, _ := wire.AppendServerMessage(nil, m, ver); return b }
	cases := []struct {
		frame []byte
		want  FirstKind
	}{
		{enc(&wire.InitConnection{ID: "w"}), FromWorker},
		{encS(&wire.Authenticate{WorkerID: "w"}), FromServer},
		{enc(&wire.AuthResponse{}), Neither},
		{enc(&wire.ClientDraining{}), Neither},
		{encS(&wire.ServerDraining{}), Neither},
		{nil, Neither},
	}
	for i, tc := range cases {
		if got := ClassifyFirst(tc.frame, ver).Kind; got != tc.want {
			t.Errorf("case %d: %v, want %v", i, got, tc.want)
		}
	}
}

func TestCacheSession(t *testing.T) {
	a, d := loopback(t)
	srv := goRun(func() (*Established, error) { return RunCache(context.Background(), NewConn(a, quiet()), 0) })
	wrk := goRun(func() (*Established, error) {
		return RunPeer(context.Background(), NewConn(d, quiet()), PeerConfig{WorkerID: "reader"})
	})
	s := wait(t, srv)
	if s.err != nil || len(s.est.AuthorizedPeers) != 0 || !s.est.Capabilities.Cache {
		t.Fatalf("%+v %v", s.est, s.err)
	}
	if w := wait(t, wrk); w.err != nil || w.est.WorkerID != "reader" {
		t.Fatalf("%+v %v", w.est, w.err)
	}
}

// A refusal is logged with its code and reason; it has no error of its
// own, so none is printed ("error=<nil>" read as a second failure).
func TestRefusalIsLoggedWithoutANilError(t *testing.T) {
	a, d := loopback(t)
	var logged bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil))
	srv := goRun(func() (*Established, error) {
		return RunAuthority(context.Background(), NewConn(a, quiet()), AuthorityConfig{Policy: &testPolicy{reject: &handshake.AlreadyConnected}})
	})
	wrk := goRun(func() (*Established, error) {
		return RunPeer(context.Background(), NewConn(d, ConnOptions{Logger: log}), PeerConfig{WorkerID: "w1", Capabilities: workerCaps})
	})
	wait(t, srv)
	wantHandshakeError(t, wait(t, wrk).err, 496, "worker already connected")
	mu.Lock()
	line := logged.String()
	mu.Unlock()
	if !strings.Contains(line, "handshake failed") || !strings.Contains(line, "code=496") {
		t.Fatalf("the worker's log %q, want its handshake failure with code 496", line)
	}
	if strings.Contains(line, "error=") {
		t.Errorf("the worker's log %q names an error for a refusal", line)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
