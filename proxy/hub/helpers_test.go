package hub

import (
	"log/slog"
	"sync"
	"testing"

	"gradient.dev/gradient/wire"
)

var sessionSeq uint64

// fakeWorker is a Downstream that records what the hub sends it.
type fakeWorker struct {
	session  uint64
	workerID string
	caps     wire.GradientCapabilities
	host     *wire.WorkerCapabilities

	mu       sync.Mutex
	draining bool
	got      []wire.ServerMessage
	closed   string
	// backlog is what Backlog reports; drained the callback
	// WhenDrained left, below its mark.
	backlog    int
	drained    func()
	drainBelow int
}

func (f *fakeWorker) Backlog() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.backlog
}

func (f *fakeWorker) WhenDrained(below int, fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drained, f.drainBelow = fn, below
}

// watched: a WhenDrained callback waits.
func (f *fakeWorker) watched() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drained != nil
}

// setBacklog sets the queue's fill and calls (synchronously, so tests
// see the effects at once) a waiting drain callback it satisfies.
func (f *fakeWorker) setBacklog(n int) {
	f.mu.Lock()
	f.backlog = n
	fn := f.drained
	if fn != nil && n < f.drainBelow {
		f.drained = nil
	} else {
		fn = nil
	}
	f.mu.Unlock()
	if fn != nil {
		fn()
	}
}

func (f *fakeWorker) Session() uint64                         { return f.session }
func (f *fakeWorker) WorkerID() string                        { return f.workerID }
func (f *fakeWorker) Capabilities() wire.GradientCapabilities { return f.caps }
func (f *fakeWorker) Host() *wire.WorkerCapabilities          { return f.host }

func (f *fakeWorker) Draining() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.draining
}

func (f *fakeWorker) Send(m wire.ServerMessage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, m)
}

func (f *fakeWorker) Close(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = reason
}

// take returns and forgets what the worker received.
func (f *fakeWorker) take() []wire.ServerMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.got
	f.got = nil
	return out
}

func buildWorker(id string, archs ...string) *fakeWorker {
	sessionSeq++
	return &fakeWorker{session: sessionSeq, workerID: id, caps: wire.GradientCapabilities{Build: true},
		host: &wire.WorkerCapabilities{Architectures: archs, SystemFeatures: []string{"kvm"}, MaxConcurrentBuilds: 1}}
}

func flakeWorker(id string, fetch bool) *fakeWorker {
	sessionSeq++
	return &fakeWorker{session: sessionSeq, workerID: id, caps: wire.GradientCapabilities{Fetch: fetch, Eval: true}}
}

// fakeUpstream records what the hub sends the tenant's server.
type fakeUpstream struct {
	mu   sync.Mutex
	sent []wire.ClientMessage
	h    *Upstream
}

func (u *fakeUpstream) send(m wire.ClientMessage) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sent = append(u.sent, m)
	return nil
}

func (u *fakeUpstream) take() []wire.ClientMessage {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := u.sent
	u.sent = nil
	return out
}

// attach connects a fake upstream to h and forgets its opening requests.
func attach(t *testing.T, h *Hub) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{}
	u.h = h.Attach(u.send, nil)
	u.take()
	return u
}

func newHub() *Hub { return New("tenant-a", slog.New(slog.DiscardHandler), nil) }

func of[T any](msgs []wire.ServerMessage) []T {
	var out []T
	for _, m := range msgs {
		if v, ok := m.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func upOf[T any](msgs []wire.ClientMessage) []T {
	var out []T
	for _, m := range msgs {
		if v, ok := m.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func buildCand(id, arch string, features ...string) wire.JobCandidate {
	return wire.JobCandidate{JobID: id, DrvPaths: []string{"/nix/store/" + id + ".drv"},
		Requirement: &wire.BuildRequirement{Architecture: arch, RequiredFeatures: features}}
}

func buildAssign(id, arch string) *wire.AssignJob {
	return &wire.AssignJob{JobID: id, AssignmentID: "as-" + id, Job: &wire.BuildJob{Requirement: wire.BuildRequirement{Architecture: arch}}}
}

func flakeAssign(id string, steps ...wire.FlakeStep) *wire.AssignJob {
	return &wire.AssignJob{JobID: id, AssignmentID: "as-" + id, Job: &wire.FlakeJob{Steps: steps}}
}

func ids(cands []wire.JobCandidate) []string {
	var out []string
	for _, c := range cands {
		out = append(out, c.JobID)
	}
	return out
}
