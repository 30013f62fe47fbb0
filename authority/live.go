package authority

import (
	"context"
	"fmt"
	"strings"
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
	remote      string // the worker-dialed connection's source address (RemoteAddr)
	nonce       string // tells this session from the worker ID's next in its claim

	// mu is a leaf (docs/LOCKS.md): nothing that locks runs under it, so
	// the job loop and the proxy's hub may read a session (LiveWorker's
	// getters) under their own locks. Never taken with liveSessions.mu
	// held.
	mu           sync.Mutex
	sess         *session.ServerSession // nil while the handshake runs
	live         *LiveWorker            // set with sess
	reauth       *session.ServerAuth
	kickReason   string // set by disconnect before the session was split
	grant        Grant
	capabilities wire.GradientCapabilities
	workerCaps   *wire.WorkerCapabilities
	workerLoad   *wire.WorkerMetrics
	draining     bool
	// isClaimed: the worker ID's claim across instances (Config.Claims)
	// is this session's, to renew and release.
	isClaimed bool
	// reauthPending: a reauth asked for while the handshake was finishing,
	// run once the session is up.
	reauthPending bool
}

// merge adds a reauth's grant: reauth never revokes granted peers.
func (c *workerConn) merge(g Grant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grant.merge(g)
}

// liveSessions is one connection per worker ID (docs/protocol/connection.md: a second
// connection is rejected with 496).
type liveSessions struct {
	// mu is a leaf, never held together with a workerConn's mu: copy the
	// conn out, release mu, then lock the conn (reserve, closeAll).
	mu    sync.Mutex
	conns map[string]*workerConn
	// released is closed when a conn frees its worker ID, so a refused
	// connection can wait for a dropped holder to be gone.
	released map[*workerConn]chan struct{}
}

func newLiveSessions() *liveSessions {
	return &liveSessions{conns: map[string]*workerConn{}, released: map[*workerConn]chan struct{}{}}
}

// Probing the holder of a worker ID that a second connection claims: a
// socket that died half-open (no FIN) would otherwise hold the ID until
// the heartbeat timeout, locking the reconnecting worker out for minutes.
const (
	// holderProbeTimeout bounds the ping; a worker whose reader is alive
	// answers within milliseconds.
	holderProbeTimeout = 5 * time.Second
	// holderReleaseWait bounds the wait for a dropped holder to free the
	// ID, so the refused worker's next attempt finds it free.
	holderReleaseWait = 2 * time.Second
)

// reserve claims the worker ID for a handshake that passed authorization;
// false when another session holds it. That session is pinged first
// (bounded by ctx and holderProbeTimeout) and dropped if it does not
// answer: the answer is still 496, but the worker's next attempt succeeds.
// A healthy holder is never dropped.
func (l *liveSessions) reserve(ctx context.Context, c *workerConn) bool {
	l.mu.Lock()
	holder, taken := l.conns[c.workerID]
	if !taken {
		l.conns[c.workerID] = c
		l.released[c] = make(chan struct{})
	}
	released := l.released[holder]
	l.mu.Unlock()
	if taken {
		l.probe(ctx, holder, released)
	}
	return !taken
}

// probe pings the session of holder and drops it when no pong arrives.
func (l *liveSessions) probe(ctx context.Context, holder *workerConn, released <-chan struct{}) {
	if holder == nil {
		return
	}
	holder.mu.Lock()
	sess := holder.sess
	holder.mu.Unlock()
	if sess == nil {
		return // still in its handshake, which has a deadline of its own
	}
	pctx, cancel := context.WithTimeout(ctx, holderProbeTimeout)
	err := sess.Probe(pctx)
	cancel()
	if err == nil || ctx.Err() != nil {
		return
	}
	sess.Drop(fmt.Sprintf("no answer to a ping within %s when the worker connected again", holderProbeTimeout))
	wait := time.NewTimer(holderReleaseWait)
	defer wait.Stop()
	select {
	case <-released:
	case <-wait.C:
	case <-ctx.Done():
	}
}

// release frees the worker ID if c still holds it.
func (l *liveSessions) release(c *workerConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[c.workerID] == c {
		delete(l.conns, c.workerID)
		close(l.released[c])
		delete(l.released, c)
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

// closeAll ends every established session at once with 1001 and reason,
// and returns once every close frame is claimed (queued messages drain in
// parallel, each bounded by the session's drain timeout).
func (l *liveSessions) closeAll(reason string) {
	var wg sync.WaitGroup
	for _, c := range l.all() {
		c.mu.Lock()
		sess := c.sess
		c.mu.Unlock()
		if sess != nil {
			wg.Go(func() { sess.Close(session.CloseGoingAway, reason) })
		}
	}
	wg.Wait()
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

// set keeps reason for a registered worker ID (callers check it is).
func (o *offlineReasons) set(workerID, reason string) {
	// Keyed by the canonical ID: however a worker spells its UUID, the
	// reason is found under the ID the operator asks for, and one ID is
	// one entry. Worker IDs are UUIDs, whose canonical text is lowercase.
	id := strings.ToLower(workerID)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reasons[id] = offlineReason{Reason: reason, At: time.Now()}
}

func (o *offlineReasons) get(workerID string) (offlineReason, bool) {
	id := strings.ToLower(workerID)
	o.mu.Lock()
	defer o.mu.Unlock()
	r, ok := o.reasons[id]
	return r, ok
}
