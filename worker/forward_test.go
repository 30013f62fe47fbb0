package worker

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/wire"
)

// recordingForwarder records what each forwarded session received.
type recordingForwarder struct {
	mu       sync.Mutex
	sessions []*ForwardedSession
	msgs     []wire.ServerMessage
	ended    []string
}

func (f *recordingForwarder) Forward(s ForwardedSession) ForwardHandler {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sessions = append(f.sessions, &s)
	return f
}

func (f *recordingForwarder) Handle(m wire.ServerMessage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := m.(*wire.NarPush); ok { // its frame is reused after Handle
		c := *p
		c.Data = bytes.Clone(p.Data)
		m = &c
	}
	f.msgs = append(f.msgs, m)
}

func (f *recordingForwarder) Ended(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = append(f.ended, reason)
}

func (f *recordingForwarder) received() []wire.ServerMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]wire.ServerMessage(nil), f.msgs...)
}

func (f *recordingForwarder) endings() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ended)
}

// With a Forwarder the worker keeps the session (capabilities, metrics)
// but neither polls nor answers: every job, offer and cache frame goes
// to the forwarder, whose sends reach the server, and the forwarder
// learns when the session ends.
func TestForwarderTakesTheJobSide(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	cfg := testConfig(t, f.url, newBlockingExecutor())
	cfg.Heartbeat = 20 * time.Millisecond
	fwd := &recordingForwarder{}
	cfg.Forwarder = fwd
	startWorker(t, cfg)
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
	if !s.Capabilities.Build || len(s.AuthorizedPeers) != 1 || s.Version == 0 {
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
