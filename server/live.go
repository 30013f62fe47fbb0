package server

import (
	"slices"
	"sync"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// workerConn is one live (or handshaking) worker session.
type workerConn struct {
	workerID    string
	connectedAt time.Time
	dialURL     string // set when the server dialed the worker

	mu           sync.Mutex
	sess         *session.ServerSession // nil while the handshake runs
	reauth       *session.ServerAuth
	kickReason   string // set by disconnect before the session was split
	grant        Grant
	capabilities wire.GradientCapabilities
	workerCaps   *wire.WorkerCapabilities
	draining     bool
	// reauthPending: a reauth asked for while the handshake was finishing,
	// run once the session is up.
	reauthPending bool
}

// merge adds a reauth's grant: reauth never revokes granted peers.
func (c *workerConn) merge(g Grant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range g.Projects {
		if !slices.Contains(c.grant.Projects, p) {
			c.grant.Projects = append(c.grant.Projects, p)
		}
	}
	for _, p := range g.Caches {
		if !slices.Contains(c.grant.Caches, p) {
			c.grant.Caches = append(c.grant.Caches, p)
		}
	}
	for _, p := range g.Proxies {
		if !slices.Contains(c.grant.Proxies, p) {
			c.grant.Proxies = append(c.grant.Proxies, p)
		}
	}
	c.grant.Abilities = c.grant.Abilities.union(g.Abilities)
	for p, a := range g.ProjectAbilities {
		c.grant.allow(p, a)
	}
}

// liveSessions is one connection per worker ID (connection.txt: a second
// connection is rejected with 496).
type liveSessions struct {
	mu    sync.Mutex
	conns map[string]*workerConn
}

func newLiveSessions() *liveSessions { return &liveSessions{conns: map[string]*workerConn{}} }

// reserve claims the worker ID for a handshake that passed authorization;
// false when another session holds it.
func (l *liveSessions) reserve(c *workerConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, taken := l.conns[c.workerID]; taken {
		return false
	}
	l.conns[c.workerID] = c
	return true
}

// release frees the worker ID if c still holds it.
func (l *liveSessions) release(c *workerConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[c.workerID] == c {
		delete(l.conns, c.workerID)
	}
}

func (l *liveSessions) get(workerID string) *workerConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[workerID]
}

func (l *liveSessions) all() []*workerConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*workerConn, 0, len(l.conns))
	for _, c := range l.conns {
		out = append(out, c)
	}
	return out
}

func (l *liveSessions) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// closeAll ends every established session at once.
func (l *liveSessions) closeAll(reason string) {
	for _, c := range l.all() {
		c.mu.Lock()
		sess := c.sess
		c.mu.Unlock()
		if sess != nil {
			sess.Close(closeGoingAway, reason)
		}
	}
}

// offlineReasons keeps the last failure of every registered worker ID.
type offlineReasons struct {
	mu      sync.Mutex
	reasons map[string]offlineReason
}

type offlineReason struct {
	Reason string
	At     time.Time
}

func newOfflineReasons() *offlineReasons { return &offlineReasons{reasons: map[string]offlineReason{}} }

func (o *offlineReasons) set(workerID, reason string) {
	// Keyed by the canonical ID: however a worker spells its UUID, the
	// reason is found under the ID the operator asks for, and one ID is
	// one entry. No peer can have registered an ID that is not a UUID.
	id, err := parseWorkerID(workerID)
	if err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reasons[id] = offlineReason{Reason: reason, At: time.Now()}
}

func (o *offlineReasons) get(workerID string) (offlineReason, bool) {
	id, _ := parseWorkerID(workerID)
	o.mu.Lock()
	defer o.mu.Unlock()
	r, ok := o.reasons[id]
	return r, ok
}

// closeGoingAway is WebSocket close code 1001: the server is going down.
const closeGoingAway = 1001
