// Package authoritytest gives job loops' unit tests live workers without a
// session.
package authoritytest

import (
	"sync"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/wire"
)

// NewLiveWorker makes a LiveWorker without a connection: it sends through
// send and has the given state (projects: what each authorized project
// allows; host may be nil: no WorkerCapabilities sent).
func NewLiveWorker(workerID string, projects map[string]authority.Abilities, caps wire.GradientCapabilities, host *wire.WorkerCapabilities, send func(wire.ServerMessage) error) *authority.LiveWorker {
	g := authority.Grant{WorkerID: workerID}
	for p, a := range projects {
		g.Projects = append(g.Projects, p)
		g.Allow(p, a)
	}
	return authority.NewLiveWorkerForTest(workerID, g, caps, host, send)
}

// Drain marks w draining, as its session does when the worker sends
// Draining.
func Drain(w *authority.LiveWorker) { authority.DrainForTest(w) }

// HostRecorder is a job loop that keeps each worker's live session, so a
// test can read what the authority recorded of it (WorkerCapabilities,
// WorkerMetrics) and how many of each job message it sent. It runs no
// jobs.
type HostRecorder struct {
	mu       sync.Mutex
	live     map[string]*authority.LiveWorker
	received map[string]map[string]int // worker ID → wire name → count
}

var _ authority.JobLoop = (*HostRecorder)(nil)

// NewHostRecorder returns an empty recorder.
func NewHostRecorder() *HostRecorder {
	return &HostRecorder{live: map[string]*authority.LiveWorker{}, received: map[string]map[string]int{}}
}

func (r *HostRecorder) SessionStarted(w *authority.LiveWorker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live[w.WorkerID] = w
}

func (r *HostRecorder) HandleJobMessage(w *authority.LiveWorker, m wire.ClientMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.received[w.WorkerID] == nil {
		r.received[w.WorkerID] = map[string]int{}
	}
	r.received[w.WorkerID][m.WireName()]++
}

// Received is how many messages named name (a wire name such as
// "WorkerMetrics") workerID's sessions have sent to the job loop.
func (r *HostRecorder) Received(workerID, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.received[workerID][name]
}

func (r *HostRecorder) SessionEnded(w *authority.LiveWorker, _ string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live[w.WorkerID] == w {
		delete(r.live, w.WorkerID)
	}
}

// Host is the WorkerCapabilities recorded for workerID's live session,
// nil without one.
func (r *HostRecorder) Host(workerID string) *wire.WorkerCapabilities {
	r.mu.Lock()
	w := r.live[workerID]
	r.mu.Unlock()
	if w == nil {
		return nil
	}
	return w.WorkerCapabilities()
}

// Metrics is the WorkerMetrics recorded for workerID's live session, nil
// without one (or before its first heartbeat).
func (r *HostRecorder) Metrics(workerID string) *wire.WorkerMetrics {
	r.mu.Lock()
	w := r.live[workerID]
	r.mu.Unlock()
	if w == nil {
		return nil
	}
	return w.WorkerMetrics()
}
