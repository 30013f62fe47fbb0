package authority

import (
	"context"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/session/limit"
	"gradient.dev/gradient/wire"
)

// Policy decides who may hold a session that a worker dialed, and what it
// may do. The server implements it on its registrations; the federation
// proxy on its own rows of authorized workers.
type Policy interface {
	// Challenge lists the peers workerID must present tokens for; known
	// reports that some peer registered it. An error aborts the handshake.
	Challenge(ctx context.Context, workerID string) (peers []string, known bool, err error)
	// Authorize checks the tokens the worker answered with (secrets:
	// never log them) and decides. It is asked again on every reauth of
	// the live session, whose grant then only grows. RemoteAddr(ctx) is
	// the connection's source address.
	Authorize(ctx context.Context, workerID string, tokens []wire.Pair[string, string]) (Grant, error)
}

// DialedPolicy decides a session its owner dialed: the worker accepted the
// tokens the dial presented, so only the policy's own checks remain.
type DialedPolicy interface {
	// Admit decides the dialed worker's session.
	Admit(ctx context.Context, workerID string) (Grant, error)
	// Reauthorize is what the presented tokens grant now; redial asks for
	// a new dial, e.g. because a peer appeared whose token this dial did
	// not present.
	Reauthorize(ctx context.Context, workerID string) (g Grant, redial bool, err error)
}

// notAccepting refuses a new session while the authority does not accept.
var notAccepting = handshake.Reject(403, "server is not accepting connections")

// admission is the session.Authority of one worker-dialed connection: it
// asks the policy, claims the worker ID (496 for a second connection) and
// keeps the grant for the dispatch loop; on reauth it merges what the
// policy grants now.
type admission struct {
	a    *Authority
	conn *workerConn
	// known: the worker ID is registered, so its failures are kept as its
	// offline reason.
	known       bool
	established bool
	reserved    bool
	// ticket is the session's place in the connection budget (nil
	// outside ProtoHandler); not shed once its tokens are being checked.
	ticket *limit.Ticket
}

func (ad *admission) Challenge(ctx context.Context, workerID string) ([]string, error) {
	peers, known, err := ad.a.cfg.Policy.Challenge(ctx, workerID)
	if err != nil {
		return nil, err
	}
	ad.known = known
	return peers, nil
}

func (ad *admission) Authorize(ctx context.Context, workerID string, tokens []wire.Pair[string, string]) (handshake.Decision, error) {
	if !ad.established && !ad.a.Accepting() {
		return notAccepting, nil
	}
	if !ad.established {
		ad.ticket.Authenticating()
	}
	g, err := ad.a.cfg.Policy.Authorize(withRemote(ctx, ad.conn.remote), workerID, tokens)
	if err != nil {
		return handshake.Decision{}, err
	}
	ad.known = g.Known
	if ad.established {
		// Reauth: add what the new tokens grant; never revoke.
		if !g.Rejected() {
			ad.conn.merge(g)
		}
		return g.Decision, nil
	}
	if g.Rejected() {
		return g.Decision, nil
	}
	return ad.a.admit(ctx, ad.conn, workerID, g, &ad.reserved)
}

// dialAdmission is the session.Admitter (and reauthorizer) of one session
// the authority's owner dialed.
type dialAdmission struct {
	a        *Authority
	conn     *workerConn
	policy   DialedPolicy
	reserved bool // the handshake claimed the worker ID
}

func (ad *dialAdmission) Admit(ctx context.Context, workerID string, _ wire.GradientCapabilities) (handshake.Decision, error) {
	g, err := ad.policy.Admit(ctx, workerID)
	if err != nil {
		return handshake.Decision{}, err
	}
	if !ad.a.Accepting() {
		return notAccepting, nil
	}
	if g.Rejected() {
		return g.Decision, nil
	}
	return ad.a.admit(ctx, ad.conn, workerID, g, &ad.reserved)
}

func (ad *dialAdmission) Reauthorize(ctx context.Context, workerID string) (handshake.Decision, bool, error) {
	g, redial, err := ad.policy.Reauthorize(ctx, workerID)
	if err != nil {
		return handshake.Decision{}, false, err
	}
	if !g.Rejected() {
		ad.conn.merge(g)
	}
	return g.Decision, redial, nil
}

// admit gives conn the accepted grant and claims its worker ID, here and
// across instances (Config.Claims); a second connection gets 496. An
// error (the claims' database) aborts the handshake.
func (a *Authority) admit(ctx context.Context, conn *workerConn, workerID string, g Grant, reserved *bool) (handshake.Decision, error) {
	if g.WorkerID == "" {
		g.WorkerID = workerID
	}
	conn.workerID = g.WorkerID
	conn.grant = g
	if !a.live.reserve(ctx, conn) {
		return handshake.AlreadyConnected.Decide(), nil
	}
	if a.cfg.Claims != nil {
		d, ok, err := a.claim(ctx, conn)
		if !ok {
			a.live.release(conn)
			return d, err
		}
	}
	*reserved = true
	return g.Decision, nil
}
