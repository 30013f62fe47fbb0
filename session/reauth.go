package session

import (
	"context"
	"errors"
	"slices"
	"sync"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// ServerAuth is the server's authorization state of one established
// session, driving reauth (SESSION.md §5). Reauth only adds peers: a peer
// granted once stays granted for the session.
type ServerAuth struct {
	mu           sync.Mutex
	workerID     string
	caps         wire.GradientCapabilities
	serverDialed bool
	authority    Authority // worker-dialed sessions
	admitter     Admitter  // server-dialed sessions
	granted      []string
	challenged   bool // an AuthChallenge awaits its AuthResponse
}

// NewWorkerDialedAuth is the state of a session the worker dialed.
func NewWorkerDialedAuth(est *Established, policy Authority) *ServerAuth {
	return &ServerAuth{workerID: est.WorkerID, caps: est.Capabilities, authority: policy, granted: slices.Clone(est.AuthorizedPeers)}
}

// NewServerDialedAuth is the state of a session the server dialed.
func NewServerDialedAuth(est *Established, policy Admitter) *ServerAuth {
	return &ServerAuth{workerID: est.WorkerID, caps: est.Capabilities, admitter: policy, serverDialed: true, granted: slices.Clone(est.AuthorizedPeers)}
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

// OnReauthRequest answers a worker's ReauthRequest: AuthChallenge on a
// worker-dialed session; AuthUpdate directly on a server-dialed one, with
// closeAfter set when the reauth found a new registration (the next dial
// carries its token).
func (a *ServerAuth) OnReauthRequest(ctx context.Context) (reply wire.ServerMessage, closeAfter bool, err error) {
	if !a.serverDialed {
		ch, err := a.Challenge(ctx)
		return ch, false, err
	}
	d, err := a.admitter.Admit(ctx, a.workerID, a.caps)
	if err != nil {
		return nil, false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if d.Reject != nil {
		return &wire.AuthUpdate{AuthorizedPeers: slices.Clone(a.granted), FailedPeers: []wire.FailedPeer{}}, false, nil
	}
	added := a.merge(d.Authorized)
	return &wire.AuthUpdate{AuthorizedPeers: slices.Clone(a.granted), FailedPeers: a.stillFailed(d.Failed)}, added, nil
}

// Challenge starts a reauth from the server side (a peer registered the
// worker): the AuthChallenge to send.
func (a *ServerAuth) Challenge(ctx context.Context) (*wire.AuthChallenge, error) {
	if a.serverDialed {
		return nil, ErrServerDialed
	}
	peers, err := a.authority.Challenge(ctx, a.workerID)
	if err != nil {
		return nil, err
	}
	if peers == nil {
		peers = []string{}
	}
	a.mu.Lock()
	a.challenged = true
	a.mu.Unlock()
	return &wire.AuthChallenge{Peers: peers}, nil
}

// OnAuthResponse validates the tokens of a reauth and returns the
// AuthUpdate: previously granted peers plus the newly authorized ones.
// A policy rejection (e.g. every token failed) revokes nothing.
func (a *ServerAuth) OnAuthResponse(ctx context.Context, resp *wire.AuthResponse) (*wire.AuthUpdate, error) {
	a.mu.Lock()
	if !a.challenged {
		a.mu.Unlock()
		return nil, ErrNoChallenge
	}
	a.challenged = false
	a.mu.Unlock()
	d, err := a.authority.Authorize(ctx, a.workerID, resp.Tokens)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if d.Reject == nil {
		a.merge(d.Authorized)
	}
	return &wire.AuthUpdate{AuthorizedPeers: slices.Clone(a.granted), FailedPeers: a.stillFailed(d.Failed)}, nil
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
// handled is false for any other message. A server-dialed reauth that found
// a new registration closes the session after the AuthUpdate.
func ServeAuth(ctx context.Context, s *ServerSession, a *ServerAuth, m wire.ClientMessage) (handled bool, err error) {
	switch v := m.(type) {
	case *wire.ReauthRequest:
		reply, closeAfter, err := a.OnReauthRequest(ctx)
		if err != nil {
			return true, err
		}
		if err := s.Send(reply); err != nil {
			return true, err
		}
		if closeAfter {
			s.Close(CloseNormal, "new registration: reconnect")
		}
		return true, nil
	case *wire.AuthResponse:
		update, err := a.OnAuthResponse(ctx, v)
		if err != nil {
			return true, err
		}
		return true, s.Send(update)
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
