package authority

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"gradient.dev/gradient/session/handshake"
)

// Claims makes the rule of one live session per worker ID hold across
// server instances sharing one database (docs/protocol/connection.md:
// a second connection to any instance gets 496). The in-memory registry
// stays the fast path; a claim is taken once it agrees, renewed while the
// session lives and released when it ends. A nil Claims is one instance.
type Claims interface {
	// Claim takes s.WorkerID for the session s when no instance holds it
	// (or its holder's lease ran out); otherwise it returns the holding
	// instance and claims nothing.
	Claim(ctx context.Context, s ClaimedSession) (holder string, err error)
	// Renew extends the leases of this instance's sessions and returns
	// the worker IDs whose claim is no longer theirs.
	Renew(ctx context.Context, sessions []ClaimedSession) (lost []string, err error)
	// Release frees the claim of s, if it is still s's.
	Release(ctx context.Context, s ClaimedSession) error
	// ProbeHolder asks the instance holder to probe its session of
	// workerID (ProbeHolder of that instance's Authority): dropped
	// reports that the session did not answer and its claim is gone.
	ProbeHolder(ctx context.Context, holder, workerID string) (dropped bool, err error)
}

// ClaimedSession is one session's claim: Status is what other instances
// show of it.
type ClaimedSession struct {
	WorkerID    string
	Nonce       string
	ConnectedAt time.Time
	Status      WorkerStatus
}

// DefaultClaimRenewal is how often an authority renews its claims.
const DefaultClaimRenewal = 5 * time.Second

// claimCallTimeout bounds one renewal or release.
const claimCallTimeout = 5 * time.Second

// newNonce tells one session of a worker ID from the next in its claim.
func newNonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

func (c *workerConn) claimed() ClaimedSession {
	return ClaimedSession{WorkerID: c.workerID, Nonce: c.nonce, ConnectedAt: c.connectedAt}
}

// claim takes conn's worker ID across instances once the in-memory
// registry gave it; ok false is the decision to answer (496). A holder on
// another instance is probed there first, like a local holder: one that
// does not answer is dropped and the worker's next attempt wins.
func (a *Authority) claim(ctx context.Context, conn *workerConn) (d handshake.Decision, ok bool, err error) {
	claims := a.cfg.Claims
	s := conn.claimed()
	s.Status = a.statusOf(conn)
	holder, err := claims.Claim(ctx, s)
	if err != nil {
		a.metrics.claims.WithLabelValues("failed").Inc()
		a.log.Warn("claiming the worker ID failed", "worker", conn.workerID, "error", err)
		return d, false, err
	}
	if holder == "" {
		a.metrics.claims.WithLabelValues("claimed").Inc()
		conn.mu.Lock()
		conn.isClaimed = true
		conn.mu.Unlock()
		return d, true, nil
	}
	a.metrics.claims.WithLabelValues("held elsewhere").Inc()
	pctx, cancel := context.WithTimeout(ctx, holderProbeTimeout+holderReleaseWait+time.Second)
	dropped, err := claims.ProbeHolder(pctx, holder, conn.workerID)
	cancel()
	a.log.Info("worker ID held by another instance", "worker", conn.workerID, "instance", holder, "holder_dropped", dropped, "probe_error", err)
	return handshake.AlreadyConnected.Decide(), false, nil
}

// releaseConn frees conn's worker ID: its claim first, so that once the
// registry no longer holds it no instance finds it taken.
func (a *Authority) releaseConn(conn *workerConn) {
	conn.mu.Lock()
	claimed := conn.isClaimed
	conn.isClaimed = false
	conn.mu.Unlock()
	if claimed {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), claimCallTimeout)
		if err := a.cfg.Claims.Release(ctx, conn.claimed()); err != nil {
			// Its lease runs out instead.
			a.log.Warn("releasing the worker ID's claim failed", "worker", conn.workerID, "error", err)
		}
		cancel()
	}
	a.live.release(conn)
}

// renewClaims renews the claims of this authority's sessions every
// ClaimRenewal until stop closes; a session whose claim another instance
// took over (its lease ran out while the database was out of reach) is
// dropped: the worker ID is the other instance's now.
func (a *Authority) renewClaims(stop <-chan struct{}) {
	t := time.NewTicker(a.cfg.ClaimRenewal)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		a.renewOnce()
	}
}

func (a *Authority) renewOnce() {
	var list []ClaimedSession
	held := map[string]*workerConn{}
	for _, c := range a.live.all() {
		c.mu.Lock()
		claimed := c.isClaimed
		c.mu.Unlock()
		if !claimed {
			continue // its claim is being taken, or it is ending
		}
		s := c.claimed()
		s.Status = a.statusOf(c)
		list = append(list, s)
		held[c.workerID] = c
	}
	if len(list) == 0 {
		return
	}
	// Bounded by the lease rather than the interval: a slow renewal
	// still extends it, and the ticker skips the ticks it overran.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), claimCallTimeout)
	defer cancel()
	lost, err := a.cfg.Claims.Renew(ctx, list)
	if err != nil {
		a.log.Warn("renewing worker session claims failed", "sessions", len(list), "error", err)
		return
	}
	for _, id := range lost {
		c := held[id]
		c.mu.Lock()
		still := c.isClaimed
		c.isClaimed = false // the row is another session's: never release it
		sess := c.sess
		if sess == nil {
			c.kickReason = "worker ID claimed by another server instance"
		}
		c.mu.Unlock()
		if !still {
			continue
		}
		a.metrics.claims.WithLabelValues("lost").Inc()
		a.log.Warn("worker session claim lost to another instance", "worker", id)
		if sess != nil {
			sess.Drop("worker ID claimed by another server instance after this instance's lease ran out")
		}
	}
}

// ProbeHolder probes this authority's session of workerID for another
// instance where the worker connected again, and drops it when it does
// not answer (as for a second connection here); dropped reports that no
// session of this authority holds the worker ID any more.
func (a *Authority) ProbeHolder(ctx context.Context, workerID string) (dropped bool) {
	a.live.mu.Lock()
	holder := a.live.conns[workerID]
	released := a.live.released[holder]
	a.live.mu.Unlock()
	if holder == nil {
		return true
	}
	a.live.probe(ctx, holder, released)
	return a.live.get(workerID) != holder
}
