package authority_test

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// pool is a policy that is not the server's: the federation proxy's
// downstream leg (docs/protocol/federation.md) as a fixed table of workers, each row
// with its own token and allowed capabilities. The challenge names only
// the worker's own ID.
type pool struct {
	mu   sync.Mutex
	rows map[string]poolRow
}

type poolRow struct {
	token   string
	allowed wire.GradientCapabilities
}

func (p *pool) row(workerID string) (poolRow, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.rows[workerID]
	return r, ok
}

func (p *pool) revoke(workerID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.rows, workerID)
}

func (p *pool) Challenge(_ context.Context, workerID string) ([]string, bool, error) {
	if _, ok := p.row(workerID); !ok {
		return nil, false, nil
	}
	return []string{workerID}, true, nil
}

func (p *pool) Authorize(_ context.Context, workerID string, tokens []wire.Pair[string, string]) (authority.Grant, error) {
	r, ok := p.row(workerID)
	if !ok {
		return authority.Grant{Decision: handshake.UnknownWorker.Decide(), WorkerID: workerID}, nil
	}
	for _, t := range tokens {
		if t.First == workerID && subtle.ConstantTimeCompare([]byte(t.Second), []byte(r.token)) == 1 {
			return authority.Grant{
				Decision: handshake.Accept([]string{workerID}, nil, r.allowed),
				WorkerID: workerID, Known: true,
				Abilities: authority.Abilities{Fetch: r.allowed.Fetch, Eval: r.allowed.Eval, Build: r.allowed.Build},
			}, nil
		}
	}
	return authority.Grant{Decision: handshake.NoValidTokens.Decide(), WorkerID: workerID, Known: true}, nil
}

// hub stands in for the proxy's job forwarding: it records sessions.
type hub struct {
	mu      sync.Mutex
	started map[string]*authority.LiveWorker
	ended   map[string]string
}

func (h *hub) SessionStarted(w *authority.LiveWorker) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.started[w.WorkerID] = w
}
func (h *hub) HandleJobMessage(*authority.LiveWorker, wire.ClientMessage) {}
func (h *hub) SessionEnded(w *authority.LiveWorker, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended[w.WorkerID] = reason
}

func (h *hub) session(workerID string) (*authority.LiveWorker, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.started[workerID], h.ended[workerID]
}

// passthrough stands in for the proxy's cache passthrough to the tenant:
// it answers every CacheQuery with an empty status.
type passthrough struct{ w *authority.LiveWorker }

func (p passthrough) Handle(m wire.ClientMessage) {
	if q, ok := m.(*wire.CacheQuery); ok {
		p.w.Send(&wire.CacheStatus{QueryID: q.QueryID})
	}
}
func (passthrough) Close() {}

// connect runs one worker over session.Pipe against a.
func connect(t *testing.T, a *authority.Authority, workerID string, offer wire.GradientCapabilities, tokens map[string]string) (*session.WorkerSession, error) {
	t.Helper()
	serverEnd, workerEnd := session.Pipe()
	go func() {
		defer serverEnd.Close(session.CloseNormal, "")
		a.ServeWorker(serverEnd, "pipe")
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := session.NewConn(workerEnd, session.ConnOptions{Logger: slog.New(slog.DiscardHandler)})
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: workerID, Capabilities: offer, Tokens: tokens})
	if err != nil {
		workerEnd.Close(session.CloseNormal, "")
		return nil, err
	}
	sess := session.SplitWorker(c, est, session.Options{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { sess.Close(session.CloseNormal, "test over") })
	return sess, nil
}

// The proxy's downstream leg reuses the authority unchanged: its own
// table of workers, a challenge that names only the worker's own ID,
// capabilities = the offer AND the row's allowed set with federate off,
// one session per worker ID, and a revoked row closing the live session.
func TestAnotherPolicyRunsSessionsUnchanged(t *testing.T) {
	const id, other = "0190f1c2-0000-7000-8000-000000000001", "0190f1c2-0000-7000-8000-000000000002"
	p := &pool{rows: map[string]poolRow{
		id:    {token: "own-token", allowed: wire.GradientCapabilities{Build: true}},
		other: {token: "other-token", allowed: handshake.AllCapabilities},
	}}
	h := &hub{started: map[string]*authority.LiveWorker{}, ended: map[string]string{}}
	a := authority.New(authority.Config{
		Policy: p, Jobs: h, MetricsPrefix: "gradient_proxy",
		Cache:  func(s authority.CacheSession) authority.CacheHandler { return passthrough{s.Worker} },
		Logger: slog.New(slog.DiscardHandler),
	})
	defer a.Close()

	offer := wire.GradientCapabilities{Federate: true, Fetch: true, Eval: true, Build: true}
	sess, err := connect(t, a, id, offer, map[string]string{id: "own-token"})
	if err != nil {
		t.Fatalf("worker with its own token: %v", err)
	}
	if got := sess.Established.AuthorizedPeers; len(got) != 1 || got[0] != id {
		t.Errorf("authorized peers %v, want only the worker's own ID", got)
	}
	caps := sess.Established.Capabilities
	if caps.Federate || caps.Fetch || caps.Eval || !caps.Build {
		t.Errorf("negotiated %+v, want build only (offer AND allowed, federate off)", caps)
	}
	waitfor.True(t, "the job loop to see the session", func() bool { w, _ := h.session(id); return w != nil })
	if w, _ := h.session(id); w.Capabilities() != caps {
		t.Errorf("job loop sees %+v, worker %+v", w.Capabilities(), caps)
	}

	// Cache messages reach the plugged-in handler.
	if err := sess.Send(&wire.CacheQuery{QueryID: "q7", Mode: wire.QueryNormal}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			t.Fatalf("waiting for the passthrough's answer: %v", err)
		}
		if st, ok := m.(*wire.CacheStatus); ok {
			if st.QueryID != "q7" {
				t.Errorf("answer to query %q, want q7", st.QueryID)
			}
			break
		}
	}
	// A live worker keeps reading (its reader answers the registry's
	// probe of a second connection).
	go func() {
		for {
			if _, err := sess.Recv(context.Background()); err != nil {
				return
			}
		}
	}()

	// A worker presenting another row's token, or naming another peer,
	// is refused; so is a second session of the same ID.
	var he *handshake.Error
	if _, err := connect(t, a, other, offer, map[string]string{id: "own-token"}); !errors.As(err, &he) || he.Code != 401 {
		t.Errorf("other worker with a foreign token: %v, want Reject 401", err)
	}
	if _, err := connect(t, a, id, offer, map[string]string{id: "own-token"}); !errors.As(err, &he) || he.Code != 496 {
		t.Errorf("second session of one worker ID: %v, want Reject 496", err)
	}
	if _, err := connect(t, a, "0190f1c2-0000-7000-8000-00000000ffff", offer, nil); !errors.As(err, &he) || he.Code != 403 {
		t.Errorf("worker without a row: %v, want Reject 403", err)
	}

	// Revoking the row closes the live session at once.
	p.revoke(id)
	a.Disconnect(id, "worker revoked")
	select {
	case <-sess.Done():
	case <-ctx.Done():
		t.Fatal("the revoked worker's session stayed open")
	}
	if r := sess.Reason(); r == "" {
		t.Error("the worker saw no reason for the close")
	}
	waitfor.True(t, "the job loop to see the session end", func() bool { _, r := h.session(id); return r != "" })
	if _, r := h.session(id); !strings.Contains(r, "worker revoked") {
		t.Errorf("session ended with %q, want the revoke reason", r)
	}
	if st := a.WorkerStatus(id); st.Live || !strings.Contains(st.OfflineReason, "worker revoked") {
		t.Errorf("status after revoke %+v, want offline with the reason", st)
	}
	if _, err := connect(t, a, id, offer, map[string]string{id: "own-token"}); !errors.As(err, &he) || he.Code != 403 {
		t.Errorf("revoked worker reconnecting: %v, want Reject 403", err)
	}
}
