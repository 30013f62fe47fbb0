package session

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// loopback returns both ends of a real WebSocket over 127.0.0.1: the
// accepted end (as an http handler sees it) and the dialed end.
func loopback(t testing.TB) (accepted, dialed Transport) {
	t.Helper()
	got := make(chan Transport, 1)
	release := make(chan struct{})
	srv := httptest.NewServer(Handler(func(r *http.Request, tr Transport) {
		got <- tr
		<-release
	}))
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/proto"
	d, err := Dial(context.Background(), url, DialOptions{Logger: discardLogger()})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	select {
	case a := <-got:
		t.Cleanup(func() {
			// Both ends close at once so neither waits for the other's
			// close frame.
			go a.Close(CloseNormal, "")
			d.Close(CloseNormal, "")
			close(release)
			srv.Close()
		})
		return a, d
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted")
	}
	return nil, nil
}

// testPolicy is a server policy: peers registered the worker, each with a
// valid token; reject short-circuits every decision.
type testPolicy struct {
	peers   []string
	valid   map[string]string
	reject  *handshake.Rejection
	allowed wire.GradientCapabilities
}

func (p *testPolicy) Challenge(ctx context.Context, workerID string) ([]string, error) {
	return p.peers, nil
}

func (p *testPolicy) Authorize(ctx context.Context, workerID string, tokens []wire.Pair[string, string]) (handshake.Decision, error) {
	if p.reject != nil {
		return p.reject.Decide(), nil
	}
	var ok []string
	var failed []wire.FailedPeer
	for _, peer := range p.peers {
		given, found := "", false
		for _, t := range tokens {
			if t.First == peer {
				given, found = t.Second, true
				break
			}
		}
		switch {
		case !found:
			failed = append(failed, wire.FailedPeer{PeerID: peer, Reason: handshake.ReasonNoToken})
		case given != p.valid[peer]:
			failed = append(failed, wire.FailedPeer{PeerID: peer, Reason: handshake.ReasonInvalidToken})
		default:
			ok = append(ok, peer)
		}
	}
	if len(p.peers) > 0 && len(ok) == 0 {
		return handshake.NoValidTokens.Decide(), nil
	}
	return handshake.Accept(ok, failed, p.allowed), nil
}

func (p *testPolicy) Admit(ctx context.Context, workerID string, offered wire.GradientCapabilities) (handshake.Decision, error) {
	if p.reject != nil {
		return p.reject.Decide(), nil
	}
	return handshake.Accept(p.peers, nil, p.allowed), nil
}

// tokenSet is a dialed worker's verifier: the server must present exactly
// these tokens.
type tokenSet map[string]string

func (s tokenSet) VerifyServer(workerID string, tokens []wire.Pair[string, string]) bool {
	for _, t := range tokens {
		if s[t.First] != t.Second {
			return false
		}
	}
	return true
}

type result struct {
	est *Established
	err error
}

func goRun(f func() (*Established, error)) <-chan result {
	ch := make(chan result, 1)
	go func() { est, err := f(); ch <- result{est, err} }()
	return ch
}

func wait(t testing.TB, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("handshake did not finish")
	}
	return result{}
}

func quiet() ConnOptions { return ConnOptions{Logger: discardLogger()} }
