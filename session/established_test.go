package session

import (
	"context"
	"testing"

	"gradient.dev/gradient/session/handshake"
)

// establish runs authority and peer over a real loopback and splits both.
func establish(t testing.TB, policy *testPolicy, tokens map[string]string, serverOpts, workerOpts Options) (*ServerSession, *WorkerSession) {
	t.Helper()
	a, d := loopback(t)
	sc, wc := NewConn(a, quiet()), NewConn(d, quiet())
	srv := goRun(func() (*Established, error) {
		return RunAuthority(context.Background(), sc, AuthorityConfig{Policy: policy})
	})
	wrk := goRun(func() (*Established, error) {
		return RunPeer(context.Background(), wc, PeerConfig{WorkerID: "w1", Capabilities: workerCaps, Tokens: tokens})
	})
	s, w := wait(t, srv), wait(t, wrk)
	if s.err != nil || w.err != nil {
		t.Fatalf("handshake: %v / %v", s.err, w.err)
	}
	if serverOpts.Logger == nil {
		serverOpts.Logger = discardLogger()
	}
	if workerOpts.Logger == nil {
		workerOpts.Logger = discardLogger()
	}
	ss, ws := SplitServer(sc, s.est, serverOpts), SplitWorker(wc, w.est, workerOpts)
	t.Cleanup(func() {
		ss.Close(CloseNormal, "test over")
		ws.Close(CloseNormal, "test over")
	})
	return ss, ws
}

func openPolicy() *testPolicy { return &testPolicy{allowed: handshake.AllCapabilities} }
