package session

import (
	"context"
	"errors"
	"slices"
	"sync"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// DialedReauthorizer is the server's policy for reauths of a session it
// dialed, which are answered with AuthUpdate, never a challenge
// (docs/protocol/session.md §5).
type DialedReauthorizer interface {
	// Reauthorize decides what the worker is granted now through the
	// tokens the dial presented. redial reports a registration at the
	// dialed URL whose token the dial did not present: the session must
	// close, so the next dial carries it.
	Reauthorize(ctx context.Context, workerID string) (d handshake.Decision, redial bool, err error)
}

// ServerAuth is the server's authorization state of one established
// session, driving reauth (docs/protocol/session.md §5). Reauth only adds peers: a peer
// granted once stays granted for the session.
//
// A worker-dialed session has at most one AuthChallenge outstanding.
// Triggers that arrive meanwhile (another ReauthRequest, another peer
// registering) are merged: the response is answered with its AuthUpdate
// and followed by one fresh challenge, so the worker can present tokens
// for whatever changed. Any number of triggers thus ends in AuthUpdates,
// and each token check (argon2id, costly) runs once per round, not once
// per trigger.
type ServerAuth struct {
	mu           sync.Mutex
	workerID     string
	serverDialed bool
	authority    Authority          // worker-dialed sessions
	dialed       DialedReauthorizer // server-dialed sessions
	granted      []string
	challenged   bool // an AuthChallenge awaits its AuthResponse
	again        bool // a trigger arrived while challenged: challenge again after the response
}

// NewWorkerDialedAuth is the state of a session the worker dialed.
func NewWorkerDialedAuth(est *Established, policy Authority) *ServerAuth {
	return &ServerAuth{workerID: est.WorkerID, authority: policy, granted: slices.Clone(est.AuthorizedPeers)}
}

// NewServerDialedAuth is the state of a session the server dialed.
func NewServerDialedAuth(est *Established, policy DialedReauthorizer) *ServerAuth {
	return &ServerAuth{workerID: est.WorkerID, dialed: policy, serverDialed: true, granted: slices.Clone(est.AuthorizedPeers)}
}

// Granted lists the peers authorized so far.
func (a *ServerAuth) Granted() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.granted)
}

// ErrNoChallenge: an AuthResponse arrived without an AuthChallenge.
var ErrNoChallenge = errors.New("AuthResponse without AuthChallenge")

// ErrServerDialed: a server-dialed session is never challenged.
var ErrServerDialed = errors.New("server-dialed sessions are not challenged")

// Reauth runs one reauth trigger on s: the worker's ReauthRequest, or the
// server's own after a peer registered the worker or a project changed
// what it grants. A worker-dialed session gets an AuthChallenge, unless
// one is outstanding already (the trigger then rides on the challenge
// after its response; sent is nil). A server-dialed session gets an
// AuthUpdate at once, and is closed after it when the reauth found a new
// registration at the dialed URL (redial).
func Reauth(ctx context.Context, s *ServerSession, a *ServerAuth) (sent wire.ServerMessage, redial bool, err error) {
	if a.serverDialed {
		update, redial, err := a.reauthDialed(ctx)
		if err != nil {
			return nil, false, err
		}
		if err := s.Send(update); err != nil {
			return nil, false, err
		}
		if redial {
			s.Close(CloseNormal, "new registration: reconnect")
		}
		return update, redial, nil
	}
	ch, err := a.Challenge(ctx)
	if err != nil || ch == nil {
		return nil, false, err
	}
	return ch, false, s.Send(ch)
}

// reauthDialed answers a reauth of a server-dialed session.
func (a *ServerAuth) reauthDialed(ctx context.Context) (*wire.AuthUpdate, bool, error) {
	d, redial, err := a.dialed.Reauthorize(ctx, a.workerID)
	if err != nil {
		return nil, false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if d.Reject != nil {
		return &wire.AuthUpdate{AuthorizedPeers: slices.Clone(a.granted), FailedPeers: []wire.FailedPeer{}}, redial, nil
	}
	a.merge(d.Authorized)
	return &wire.AuthUpdate{AuthorizedPeers: slices.Clone(a.granted), FailedPeers: a.stillFailed(d.Failed)}, redial, nil
}

// Challenge starts a reauth of a worker-dialed session: the AuthChallenge
// to send, or nil when one is outstanding (the trigger is merged into the
// challenge that follows its response).
func (a *ServerAuth) Challenge(ctx context.Context) (*wire.AuthChallenge, error) {
	if a.serverDialed {
		return nil, ErrServerDialed
	}
	a.mu.Lock()
	if a.challenged {
		a.again = true
		a.mu.Unlock()
		return nil, nil
	}
	a.challenged = true
	a.mu.Unlock()
	return a.challenge(ctx)
}

// challenge builds the AuthChallenge of a round that holds a.challenged;
// on failure the round ends.
func (a *ServerAuth) challenge(ctx context.Context) (*wire.AuthChallenge, error) {
	peers, err := a.authority.Challenge(ctx, a.workerID)
	if err != nil {
		a.mu.Lock()
		a.challenged, a.again = false, false
		a.mu.Unlock()
		return nil, err
	}
	if peers == nil {
		peers = []string{}
	}
	return &wire.AuthChallenge{Peers: peers}, nil
}

// OnAuthResponse validates the tokens of a reauth and returns the
// AuthUpdate (previously granted peers plus the newly authorized ones)
// and, when triggers arrived while the challenge was outstanding, the
// next AuthChallenge to send after it. A policy rejection (e.g. every
// token failed) revokes nothing.
func (a *ServerAuth) OnAuthResponse(ctx context.Context, resp *wire.AuthResponse) (update *wire.AuthUpdate, next *wire.AuthChallenge, err error) {
	a.mu.Lock()
	if !a.challenged {
		a.mu.Unlock()
		return nil, nil, ErrNoChallenge
	}
	a.mu.Unlock()
	d, err := a.authority.Authorize(ctx, a.workerID, resp.Tokens)
	a.mu.Lock()
	again := a.again && err == nil
	a.challenged, a.again = again, false
	if err != nil {
		a.mu.Unlock()
		return nil, nil, err
	}
	if d.Reject == nil {
		a.merge(d.Authorized)
	}
	update = &wire.AuthUpdate{AuthorizedPeers: slices.Clone(a.granted), FailedPeers: a.stillFailed(d.Failed)}
	a.mu.Unlock()
	if again {
		next, err = a.challenge(ctx)
	}
	return update, next, err
}

// merge adds newly authorized peers; it reports whether any was new.
func (a *ServerAuth) merge(authorized []string) bool {
	added := false
	for _, p := range authorized {
		if !slices.Contains(a.granted, p) {
			a.granted = append(a.granted, p)
			added = true
		}
	}
	return added
}

// stillFailed drops failures of peers granted earlier: reauth never
// revokes, so reporting them as failed would contradict AuthorizedPeers.
func (a *ServerAuth) stillFailed(failed []wire.FailedPeer) []wire.FailedPeer {
	out := []wire.FailedPeer{}
	for _, f := range failed {
		if !slices.Contains(a.granted, f.PeerID) {
			out = append(out, f)
		}
	}
	return out
}

// ServeAuth handles the reauth messages of a server session's dispatch
// loop: ReauthRequest and AuthResponse are answered through the writer;
// handled is false for any other message.
func ServeAuth(ctx context.Context, s *ServerSession, a *ServerAuth, m wire.ClientMessage) (handled bool, err error) {
	switch v := m.(type) {
	case *wire.ReauthRequest:
		_, _, err := Reauth(ctx, s, a)
		return true, err
	case *wire.AuthResponse:
		update, next, err := a.OnAuthResponse(ctx, v)
		if update != nil {
			if err := s.Send(update); err != nil {
				return true, err
			}
		}
		if next != nil {
			if err := s.Send(next); err != nil {
				return true, err
			}
		}
		return true, err
	}
	return false, nil
}

// WorkerAuth is the worker's side of reauth: the tokens it holds and the
// peers granted so far.
type WorkerAuth struct {
	mu      sync.Mutex
	tokens  map[string]string
	granted []string
	failed  []wire.FailedPeer
}

// NewWorkerAuth starts from the handshake's result and the peers file.
func NewWorkerAuth(est *Established, tokens map[string]string) *WorkerAuth {
	return &WorkerAuth{tokens: tokens, granted: slices.Clone(est.AuthorizedPeers), failed: slices.Clone(est.FailedPeers)}
}

// RequestReauth records the new peers file and sends ReauthRequest.
func (a *WorkerAuth) RequestReauth(s *WorkerSession, tokens map[string]string) error {
	a.mu.Lock()
	a.tokens = tokens
	a.mu.Unlock()
	return s.Send(&wire.ReauthRequest{})
}

// Answer builds the AuthResponse for a challenge: the explicit token of
// each challenged peer, else the `*` token; other peers are left out.
func (a *WorkerAuth) Answer(ch *wire.AuthChallenge) *wire.AuthResponse {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &wire.AuthResponse{Tokens: handshake.AnswerChallenge(ch.Peers, a.tokens)}
}

// Apply records an AuthUpdate.
func (a *WorkerAuth) Apply(u *wire.AuthUpdate) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range u.AuthorizedPeers {
		if !slices.Contains(a.granted, p) {
			a.granted = append(a.granted, p)
		}
	}
	a.failed = slices.Clone(u.FailedPeers)
}

// Granted lists the peers authorized so far; Failed the last failures.
func (a *WorkerAuth) Granted() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.granted)
}

func (a *WorkerAuth) Failed() []wire.FailedPeer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.failed)
}

// HandleAuth handles the auth messages of a worker session's dispatch loop:
// an AuthChallenge is answered, an AuthUpdate applied; handled is false for
// any other message.
func HandleAuth(s *WorkerSession, a *WorkerAuth, m wire.ServerMessage) (handled bool, err error) {
	switch v := m.(type) {
	case *wire.AuthChallenge:
		return true, s.Send(a.Answer(v))
	case *wire.AuthUpdate:
		a.Apply(v)
		return true, nil
	}
	return false, nil
}
