// Package authoritytest gives job loops' unit tests live workers without a
// session.
package authoritytest

import (
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
