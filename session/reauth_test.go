package session

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// serveLoop runs a server dispatch loop that only handles auth messages.
func serveLoop(t *testing.T, ss *ServerSession, auth *ServerAuth) {
	go func() {
		for {
			m, err := ss.Reader.Recv(context.Background())
			if err != nil {
				return
			}
			if handled, err := ServeAuth(context.Background(), ss, auth, m); !handled || err != nil {
				t.Errorf("%s: handled %v, %v", m.WireName(), handled, err)
			}
		}
	}()
}

// workerLoop handles auth messages and reports every server message.
func workerLoop(ws *WorkerSession, auth *WorkerAuth) <-chan wire.ServerMessage {
	seen := make(chan wire.ServerMessage, 16)
	go func() {
		defer close(seen)
		for {
			m, err := ws.Reader.Recv(context.Background())
			if err != nil {
				return
			}
			HandleAuth(ws, auth, m)
			seen <- m
		}
	}()
	return seen
}

func nextUpdate(t *testing.T, seen <-chan wire.ServerMessage, wantChallenge bool) *wire.AuthUpdate {
	t.Helper()
	challenged := false
	for {
		select {
		case m, ok := <-seen:
			if !ok {
				t.Fatal("session ended")
			}
			switch v := m.(type) {
			case *wire.AuthChallenge:
				challenged = true
			case *wire.AuthUpdate:
				if challenged != wantChallenge {
					t.Fatalf("challenged %v, want %v", challenged, wantChallenge)
				}
				return v
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no AuthUpdate")
		}
	}
}

// mutablePolicy lets a test register peers while the session runs.
type mutablePolicy struct {
	mu sync.Mutex
	testPolicy
	redial bool // a dialed session's reauth finds a new registration at its URL
}

func (p *mutablePolicy) set(peers []string, valid map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.peers, p.valid = peers, valid
}

func (p *mutablePolicy) Challenge(ctx context.Context, id string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.testPolicy.Challenge(ctx, id)
}

func (p *mutablePolicy) Authorize(ctx context.Context, id string, tokens []wire.Pair[string, string]) (d handshake.Decision, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.testPolicy.Authorize(ctx, id, tokens)
}

func (p *mutablePolicy) Reauthorize(ctx context.Context, id string) (handshake.Decision, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.testPolicy.Admit(ctx, id, wire.GradientCapabilities{})
	return d, p.redial, err
}

func (p *mutablePolicy) Admit(ctx context.Context, id string, offered wire.GradientCapabilities) (handshake.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.testPolicy.Admit(ctx, id, offered)
}

func TestReauthWorkerDialed(t *testing.T) {
	policy := &mutablePolicy{testPolicy: testPolicy{peers: []string{"p1"}, valid: map[string]string{"p1": "t1"}, allowed: workerCaps}}
	ss, ws := establish(t, &policy.testPolicy, map[string]string{"p1": "t1"}, Options{}, Options{})
	sAuth := NewWorkerDialedAuth(&ss.Established, policy)
	wAuth := NewWorkerAuth(&ws.Established, map[string]string{"p1": "t1"})
	serveLoop(t, ss, sAuth)
	seen := workerLoop(ws, wAuth)

	// The worker's peers file gains p2: ReauthRequest → AuthChallenge →
	// AuthResponse → AuthUpdate.
	policy.set([]string{"p1", "p2"}, map[string]string{"p1": "t1", "p2": "t2"})
	if err := wAuth.RequestReauth(ws, map[string]string{"p1": "t1", "p2": "t2"}); err != nil {
		t.Fatal(err)
	}
	u := nextUpdate(t, seen, true)
	if !slices.Equal(u.AuthorizedPeers, []string{"p1", "p2"}) || !slices.Equal(wAuth.Granted(), []string{"p1", "p2"}) {
		t.Fatalf("update %+v", u)
	}

	// Every token now fails: the server reports failures but revokes nothing.
	if err := wAuth.RequestReauth(ws, map[string]string{"p1": "bad", "p2": "bad"}); err != nil {
		t.Fatal(err)
	}
	u = nextUpdate(t, seen, true)
	if !slices.Equal(u.AuthorizedPeers, []string{"p1", "p2"}) || !slices.Equal(sAuth.Granted(), []string{"p1", "p2"}) {
		t.Fatalf("revoked: %+v", u)
	}

	// Server-initiated: p3 registers the worker.
	policy.set([]string{"p1", "p2", "p3"}, map[string]string{"p1": "t1", "p2": "t2", "p3": "t3"})
	wAuth.RequestReauth(ws, map[string]string{"p3": "t3"}) // only records tokens: drain its update first
	nextUpdate(t, seen, true)
	ch, err := sAuth.Challenge(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := ss.Send(ch); err != nil {
		t.Fatal(err)
	}
	u = nextUpdate(t, seen, true)
	if !slices.Equal(u.AuthorizedPeers, []string{"p1", "p2", "p3"}) {
		t.Fatalf("update %+v", u)
	}
}

func TestReauthServerDialed(t *testing.T) {
	a, d := loopback(t)
	policy := &mutablePolicy{testPolicy: testPolicy{peers: []string{"p1"}, allowed: workerCaps}}
	dc, wc := NewConn(d, quiet()), NewConn(a, quiet())
	srv := goRun(func() (*Established, error) {
		return RunDialer(context.Background(), dc, DialerConfig{WorkerID: "w1", Policy: policy})
	})
	wrk := goRun(func() (*Established, error) {
		return RunDialed(context.Background(), wc, DialedConfig{WorkerID: "w1", Capabilities: workerCaps})
	})
	s, w := wait(t, srv), wait(t, wrk)
	if s.err != nil || w.err != nil {
		t.Fatal(s.err, w.err)
	}
	ss, ws := SplitServer(dc, s.est, Options{Logger: discardLogger()}), SplitWorker(wc, w.est, Options{Logger: discardLogger()})
	t.Cleanup(func() { ss.Close(CloseNormal, ""); ws.Close(CloseNormal, "") })
	sAuth := NewServerDialedAuth(&ss.Established, policy)
	wAuth := NewWorkerAuth(&ws.Established, nil)
	serveLoop(t, ss, sAuth)
	seen := workerLoop(ws, wAuth)

	if err := wAuth.RequestReauth(ws, nil); err != nil {
		t.Fatal(err)
	}
	u := nextUpdate(t, seen, false)
	if !slices.Equal(u.AuthorizedPeers, []string{"p1"}) {
		t.Fatalf("update %+v", u)
	}
	if _, err := sAuth.Challenge(context.Background()); err != ErrServerDialed {
		t.Fatalf("challenge on a server-dialed session: %v", err)
	}

	// More peers through the tokens the dial presented: AuthUpdate, and
	// the session stays.
	policy.set([]string{"p1", "p2"}, nil)
	wAuth.RequestReauth(ws, nil)
	if u := nextUpdate(t, seen, false); !slices.Equal(u.AuthorizedPeers, []string{"p1", "p2"}) {
		t.Fatalf("update %+v", u)
	}
	if err := ws.Send(&wire.ReauthRequest{}); err != nil {
		t.Fatal(err)
	}
	nextUpdate(t, seen, false)
	select {
	case <-ss.Done():
		t.Fatal("the session closed without a new registration at its URL")
	default:
	}

	// A new registration at the URL: AuthUpdate, then the server closes
	// the session.
	policy.mu.Lock()
	policy.redial = true
	policy.mu.Unlock()
	wAuth.RequestReauth(ws, nil)
	nextUpdate(t, seen, false)
	select {
	case <-ss.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session kept after a new registration")
	}
}

// Triggers that overlap an outstanding challenge (peers registering, the
// worker's peers file changing) merge into one more challenge after its
// response: the session survives and ends with every peer.
func TestReauthOverlappingTriggers(t *testing.T) {
	policy := &mutablePolicy{testPolicy: testPolicy{peers: []string{"p1"}, valid: map[string]string{"p1": "t1"}, allowed: workerCaps}}
	ss, ws := establish(t, &policy.testPolicy, map[string]string{"p1": "t1"}, Options{}, Options{})
	sAuth := NewWorkerDialedAuth(&ss.Established, policy)
	serveLoop(t, ss, sAuth)
	ctx := context.Background()

	all := []string{"p1", "p2", "p3", "p4"}
	tokens := map[string]string{"p1": "t1", "p2": "t2", "p3": "t3", "p4": "t4"}
	for n := 2; n <= len(all); n++ {
		policy.set(all[:n], tokens)
		if _, _, err := Reauth(ctx, ss, sAuth); err != nil {
			t.Fatal(err)
		}
	}
	if err := ws.Send(&wire.ReauthRequest{}); err != nil {
		t.Fatal(err)
	}

	// The worker answers each challenge only now, with every token it holds.
	recv := func() wire.ServerMessage {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		m, err := ws.Recv(rctx)
		if err != nil {
			t.Fatalf("session ended: %v", err)
		}
		return m
	}
	challenges := 0
	for done := false; !done; {
		switch v := recv().(type) {
		case *wire.AuthChallenge:
			challenges++
			if err := ws.Send(&wire.AuthResponse{Tokens: handshake.AnswerChallenge(v.Peers, tokens)}); err != nil {
				t.Fatal(err)
			}
		case *wire.AuthUpdate:
			done = slices.Equal(v.AuthorizedPeers, all)
		default:
			t.Fatalf("got %s", v.WireName())
		}
	}
	if challenges != 2 {
		t.Fatalf("%d challenges for four overlapping triggers, want the first and one merged", challenges)
	}

	// The session goes on: another reauth is one more round.
	if err := ws.Send(&wire.ReauthRequest{}); err != nil {
		t.Fatal(err)
	}
	ch, ok := recv().(*wire.AuthChallenge)
	if !ok {
		t.Fatal("no challenge")
	}
	ws.Send(&wire.AuthResponse{Tokens: handshake.AnswerChallenge(ch.Peers, tokens)})
	if u, ok := recv().(*wire.AuthUpdate); !ok || !slices.Equal(u.AuthorizedPeers, all) || !slices.Equal(sAuth.Granted(), all) {
		t.Fatalf("update %+v, granted %v", u, sAuth.Granted())
	}
}
