package handshake

import (
	"fmt"

	"gradient.dev/gradient/wire"
)

// Role is which side of which handshake a Machine drives.
type Role uint8

const (
	Authority Role = iota + 1 // server, worker dialed in
	Dialer                    // server dialing a worker
	Peer                      // worker dialing the server
	Dialed                    // worker answering a server's dial
	Cache                     // server side of a read-only cache session
)

func (r Role) String() string {
	switch r {
	case Authority:
		return "authority"
	case Dialer:
		return "dialer"
	case Peer:
		return "peer"
	case Dialed:
		return "dialed"
	case Cache:
		return "cache"
	}
	return "unknown"
}

// ServerSide reports whether the role reads ClientMessages and sends
// ServerMessages.
func (r Role) ServerSide() bool { return r == Authority || r == Dialer || r == Cache }

// Action is what the driver does after sending Step.Send.
type Action uint8

const (
	Read         Action = iota + 1 // read the next message, then call Received or Lost
	AskChallenge                   // look up the peers registering WorkerID, then call Challenged
	AskAuthorize                   // validate Tokens for WorkerID, then call Decided
	AskAdmit                       // admit the dialed WorkerID offering Offered, then call Decided
	AskVerify                      // check the server's Tokens, then call Verified
	Done                           // the handshake succeeded: Result
	Fail                           // the handshake failed: Err; close the connection
)

// Step is one instruction for the driver.
type Step struct {
	// Send, if not nil, goes out first: a wire.ServerMessage for server
	// roles, a wire.ClientMessage for worker roles.
	Send     wire.Message
	Action   Action
	WorkerID string                      // AskChallenge, AskAuthorize, AskAdmit, AskVerify
	Tokens   []wire.Pair[string, string] // AskAuthorize, AskVerify (secrets: never log)
	Offered  wire.GradientCapabilities   // AskAdmit
	Result   *Result                     // Done
	Err      *Error                      // Fail
}

// Result is an established handshake.
type Result struct {
	WorkerID        string
	Capabilities    wire.GradientCapabilities // negotiated
	AuthorizedPeers []string
	FailedPeers     []wire.FailedPeer
}

type state uint8

const (
	awaitInit      state = iota + 1 // authority, dialer
	challenging                     // authority
	awaitResponse                   // authority
	deciding                        // authority, dialer
	awaitChallenge                  // peer
	awaitAck                        // peer, dialed
	awaitAuth                       // dialed
	verifying                       // dialed
	finished
)

// Machine is the handshake of one connection in one role.
type Machine struct {
	role     Role
	state    state
	ours     wire.GradientCapabilities
	workerID string
	offered  wire.GradientCapabilities
	// tokens the dialer presents, or the tokens the peer holds.
	dialTokens []wire.Pair[string, string]
	held       map[string]string
}

// NewAuthority is the server side of a worker-dialed session; server is
// the server's own capabilities (usually AllCapabilities).
func NewAuthority(server wire.GradientCapabilities) *Machine {
	return &Machine{role: Authority, state: awaitInit, ours: server}
}

// CacheSessionCapabilities are what a cache session grants: serving the
// cache, whatever the client offers (docs/protocol/cache.md §8: "cache only").
var CacheSessionCapabilities = wire.GradientCapabilities{Cache: true}

// NewCache is the server side of a cache session (/cache/{cache}/proto):
// InitConnection is answered by InitAck with no peers, no challenge and
// CacheSessionCapabilities; access was decided on the upgrade request.
func NewCache() *Machine {
	return &Machine{role: Cache, state: awaitInit, ours: CacheSessionCapabilities}
}

// NewDialer is the server dialing workerID with one (peer, token) pair per
// registration holding a token for the dialed URL.
func NewDialer(workerID string, tokens []wire.Pair[string, string], server wire.GradientCapabilities) *Machine {
	return &Machine{role: Dialer, state: awaitInit, ours: server, workerID: workerID, dialTokens: tokens}
}

// NewPeer is a worker dialing the server; held maps peer id to token (the
// peers file).
func NewPeer(workerID string, worker wire.GradientCapabilities, held map[string]string) *Machine {
	return &Machine{role: Peer, state: awaitChallenge, ours: WorkerAdvertised(worker), workerID: workerID, held: held}
}

// NewDialed is a worker answering a server's dial.
func NewDialed(workerID string, worker wire.GradientCapabilities) *Machine {
	return &Machine{role: Dialed, state: awaitAuth, ours: WorkerAdvertised(worker), workerID: workerID}
}

// Role is the machine's role.
func (m *Machine) Role() Role { return m.role }

// Start is the first step: send the opening message or read.
func (m *Machine) Start() Step {
	switch m.role {
	case Dialer:
		return Step{Send: &wire.Authenticate{WorkerID: m.workerID, Tokens: m.dialTokens}, Action: Read}
	case Peer:
		return Step{Send: &wire.InitConnection{Capabilities: m.ours, ID: m.workerID}, Action: Read}
	}
	return Step{Action: Read}
}

// Received feeds a decoded message from the other side.
func (m *Machine) Received(msg wire.Message) Step {
	switch m.state {
	case awaitInit:
		return m.onInit(msg)
	case awaitResponse:
		resp, ok := msg.(*wire.AuthResponse)
		if !ok {
			return m.reject(400, "expected AuthResponse")
		}
		m.state = deciding
		return Step{Action: AskAuthorize, WorkerID: m.workerID, Tokens: resp.Tokens}
	case awaitChallenge:
		switch v := msg.(type) {
		case *wire.AuthChallenge:
			m.state = awaitAck
			return Step{Send: &wire.AuthResponse{Tokens: m.answer(v.Peers)}, Action: Read}
		case *wire.InitAck:
			// Cache sessions skip the challenge round.
			return m.acked(v)
		}
		return m.unexpected(msg, "AuthChallenge")
	case awaitAck:
		if ack, ok := msg.(*wire.InitAck); ok {
			return m.acked(ack)
		}
		return m.unexpected(msg, "InitAck")
	case awaitAuth:
		auth, ok := msg.(*wire.Authenticate)
		if !ok {
			return m.reject(400, "expected Authenticate")
		}
		if auth.WorkerID != m.workerID {
			return m.reject(WrongServerToken.Code, WrongServerToken.Reason)
		}
		m.state = verifying
		return Step{Action: AskVerify, WorkerID: auth.WorkerID, Tokens: auth.Tokens}
	}
	return m.abort("message out of turn: "+msg.WireName(), nil)
}

func (m *Machine) acked(ack *wire.InitAck) Step {
	m.state = finished
	return Step{Action: Done, Result: &Result{
		WorkerID: m.workerID, Capabilities: ack.Capabilities,
		AuthorizedPeers: ack.AuthorizedPeers, FailedPeers: ack.FailedPeers,
	}}
}

func (m *Machine) onInit(msg wire.Message) Step {
	if m.role == Dialer {
		if r, ok := msg.(*wire.ClientReject); ok {
			return m.remoteReject(r.Code, r.Reason)
		}
	}
	init, ok := msg.(*wire.InitConnection)
	if !ok {
		return m.reject(400, "expected InitConnection")
	}
	m.offered = init.Capabilities
	if m.role == Dialer {
		if init.ID != m.workerID {
			return m.reject(400, fmt.Sprintf("dialed worker answered as %s", init.ID))
		}
		m.state = deciding
		return Step{Action: AskAdmit, WorkerID: m.workerID, Offered: m.offered}
	}
	m.workerID = init.ID
	if m.role == Cache {
		m.state = deciding
		return m.Decided(Accept(nil, nil, CacheSessionCapabilities), nil)
	}
	m.state = challenging
	return Step{Action: AskChallenge, WorkerID: m.workerID}
}

// answer picks the tokens for a challenge (see AnswerChallenge).
func (m *Machine) answer(peers []string) []wire.Pair[string, string] {
	return AnswerChallenge(peers, m.held)
}

// unexpected handles a worker role's wrong message: a Reject or Error from
// the server ends with its code, anything else ends without one.
func (m *Machine) unexpected(msg wire.Message, want string) Step {
	switch v := msg.(type) {
	case *wire.ServerReject:
		return m.remoteReject(v.Code, v.Reason)
	case *wire.ServerError:
		return m.remoteReject(v.Code, v.Message)
	}
	return m.abort(fmt.Sprintf("expected %s, got %s", want, msg.WireName()), nil)
}

// Lost reports that the connection ended, was refused, or delivered an
// oversized or undecodable message before the next expected message.
func (m *Machine) Lost(cause error) Step {
	want := map[state]string{
		awaitInit: "InitConnection", awaitResponse: "AuthResponse", awaitChallenge: "AuthChallenge",
		awaitAck: "InitAck", awaitAuth: "Authenticate",
	}[m.state]
	if want == "" {
		return m.abort("connection lost", cause)
	}
	return m.abort("connection closed before "+want, cause)
}

// Challenged answers AskChallenge with the peers registering the worker
// (empty in open modes) or the store's error.
func (m *Machine) Challenged(peers []string, err error) Step {
	if m.state != challenging {
		return m.abort("challenge out of turn", nil)
	}
	if err != nil {
		return m.abort("looking up the worker's peers failed", err)
	}
	m.state = awaitResponse
	if peers == nil {
		peers = []string{}
	}
	return Step{Send: &wire.AuthChallenge{Peers: peers}, Action: Read}
}

// Decided answers AskAuthorize or AskAdmit.
func (m *Machine) Decided(d Decision, err error) Step {
	if m.state != deciding {
		return m.abort("decision out of turn", nil)
	}
	if err != nil {
		return m.abort("authorizing the worker failed", err)
	}
	if d.Reject != nil {
		return m.reject(d.Reject.Code, d.Reject.Reason)
	}
	m.state = finished
	caps := Negotiate(m.ours, m.offered, d.Allowed)
	authorized := d.Authorized
	if authorized == nil {
		authorized = []string{}
	}
	failed := d.Failed
	if failed == nil {
		failed = []wire.FailedPeer{}
	}
	return Step{
		Send:   &wire.InitAck{Capabilities: caps, AuthorizedPeers: authorized, FailedPeers: failed},
		Action: Done,
		Result: &Result{WorkerID: m.workerID, Capabilities: caps, AuthorizedPeers: authorized, FailedPeers: failed},
	}
}

// Verified answers AskVerify: whether the dialing server's tokens are
// acceptable.
func (m *Machine) Verified(ok bool) Step {
	if m.state != verifying {
		return m.abort("verification out of turn", nil)
	}
	if !ok {
		return m.reject(WrongServerToken.Code, WrongServerToken.Reason)
	}
	m.state = awaitAck
	return Step{Send: &wire.InitConnection{Capabilities: m.ours, ID: m.workerID}, Action: Read}
}

// reject sends a Reject from this side and fails with its code.
func (m *Machine) reject(code uint16, reason string) Step {
	m.state = finished
	var send wire.Message = &wire.ServerReject{Code: code, Reason: reason}
	if !m.role.ServerSide() {
		send = &wire.ClientReject{Code: code, Reason: reason}
	}
	return Step{Send: send, Action: Fail, Err: &Error{Code: code, Reason: reason, WorkerID: m.workerID}}
}

func (m *Machine) remoteReject(code uint16, reason string) Step {
	m.state = finished
	from := "server"
	if m.role.ServerSide() {
		from = "worker"
	}
	return Step{Action: Fail, Err: &Error{Code: code, Reason: reason, WorkerID: m.workerID, Remote: true, From: from}}
}

func (m *Machine) abort(reason string, cause error) Step {
	m.state = finished
	return Step{Action: Fail, Err: &Error{Reason: reason, WorkerID: m.workerID, Err: cause}}
}
