package worker

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

// startShell runs a session shell with cfg's Session and h as its
// handler until the test ends.
func startShell(t *testing.T, cfg Config, h workersession.Handler) *workersession.Shell {
	t.Helper()
	sh, err := workersession.New(cfg.Session, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := recvChan(t, "Run to return", done); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return sh
}

// recordingHandler is a workersession.Handler other than the worker (as
// the proxy's hub is): it records what each session received and reports
// the host its fields say.
type recordingHandler struct {
	mu       sync.Mutex
	sessions []*workersession.Session
	msgs     []wire.ServerMessage
	ended    []string
	host     wire.WorkerCapabilities
	free     uint64
}

func (f *recordingHandler) Host() wire.WorkerCapabilities {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.host
}

func (f *recordingHandler) Load() *wire.WorkerMetrics {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &wire.WorkerMetrics{RAMFreeMB: f.free}
}

func (f *recordingHandler) Open(s *workersession.Session) workersession.SessionHandler {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sessions = append(f.sessions, s)
	return f
}

func (f *recordingHandler) Start() {}
func (f *recordingHandler) Tick()  {}
func (f *recordingHandler) Stop()  {}

func (f *recordingHandler) Handle(m wire.ServerMessage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := m.(*wire.NarPush); ok { // kept past Handle: copied
		c := *p
		c.Data = bytes.Clone(p.Data)
		m = &c
	}
	f.msgs = append(f.msgs, m)
}

func (f *recordingHandler) Ended(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = append(f.ended, reason)
}

func (f *recordingHandler) received() []wire.ServerMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]wire.ServerMessage(nil), f.msgs...)
}

func (f *recordingHandler) endings() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ended)
}

// With another Handler than the worker (the proxy's hub) the session
// shell keeps the session (capabilities, metrics) but neither polls nor
// answers: every job, offer and cache frame goes to the handler, whose
// sends reach the server, and the handler learns when the session ends.
func TestAnotherHandlerTakesTheJobSide(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	cfg := testConfig(t, f.url, newBlockingExecutor())
	cfg.Session.Heartbeat = 20 * time.Millisecond
	fwd := &recordingHandler{}
	startShell(t, cfg, fwd)
	c := f.accept()
	if _, ok := c.next(t).(*wire.WorkerCapabilities); !ok {
		t.Fatal("first message is not WorkerCapabilities")
	}
	// Heartbeats come, RequestJob and RequestJobList never.
	for metrics := 0; metrics < 3; {
		switch m := c.next(t).(type) {
		case *wire.WorkerMetrics:
			metrics++
		default:
			t.Fatalf("the worker sent %s on a forwarded session", m.WireName())
		}
	}
	sent := []wire.ServerMessage{
		&wire.JobOffer{Candidates: []wire.JobCandidate{{JobID: "j1"}}},
		&wire.Credential{Kind: wire.CredentialSSHKey, Data: []byte("key")},
		buildJob("j1", "a1"),
		&wire.CacheStatus{QueryID: "q1"},
		&wire.NarPush{JobID: "j1", StorePath: "/nix/store/x", Data: []byte("nar")},
		&wire.UploadGrant{RequestID: 7, Target: &wire.GrantSkip{}},
		&wire.AbortJob{JobID: "j1", Reason: "r"},
		&wire.StartCluster{Attempt: "c1"},
	}
	for _, m := range sent {
		c.send(t, m)
	}
	waitfor.True(t, "every message at the forwarder", func() bool { return len(fwd.received()) == len(sent) })
	// The bulk lane's NarPush may overtake control messages: compare as sets.
	got := map[string]int{}
	for _, m := range fwd.received() {
		got[m.WireName()]++
	}
	for _, m := range sent {
		if got[m.WireName()] != 1 {
			t.Fatalf("the forwarder got %v, want one of each of %d messages", got, len(sent))
		}
	}
	fwd.mu.Lock()
	s := fwd.sessions[0]
	fwd.mu.Unlock()
	if !s.Capabilities().Build || len(s.AuthorizedPeers()) != 1 || s.Version() == 0 {
		t.Fatalf("forwarded session %+v", s)
	}
	if err := s.Send(&wire.RequestJob{Kind: wire.JobKindBuild}); err != nil {
		t.Fatal(err)
	}
	expect[*wire.RequestJob](t, c)
	// No AssignJobResponse came from the worker itself.
	c.sess.Close(1000, "bye")
	waitfor.True(t, "the forwarder told of the end", func() bool { return fwd.endings() == 1 })
}
