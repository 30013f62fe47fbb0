package handshake

import "gradient.dev/gradient/wire"

// Rejection is a code and reason sent in a Reject.
type Rejection struct {
	Code   uint16
	Reason string
}

// Decision is a policy's verdict on a worker: accept with per-peer results
// and the capabilities the worker may use, or reject with code and reason.
type Decision struct {
	Reject     *Rejection
	Authorized []string
	Failed     []wire.FailedPeer
	// Allowed bounds the negotiated capabilities (what the worker is
	// authorized for); AllCapabilities leaves them unrestricted.
	Allowed wire.GradientCapabilities
}

// Accept builds an accepting Decision.
func Accept(authorized []string, failed []wire.FailedPeer, allowed wire.GradientCapabilities) Decision {
	return Decision{Authorized: authorized, Failed: failed, Allowed: allowed}
}

// Reject builds a rejecting Decision.
func Reject(code uint16, reason string) Decision {
	return Decision{Reject: &Rejection{Code: code, Reason: reason}}
}

// Fixed policy rejections of docs/protocol/session.md §4.2 and docs/protocol/wire.md §9.3.
var (
	NoValidTokens      = Rejection{401, "no valid peer tokens provided"}
	UnknownWorker      = Rejection{403, "unknown worker"}
	WorkerDeactivated  = Rejection{403, "worker is deactivated"}
	NoTeamGrant        = Rejection{403, "no project grants this team's workers"}
	NoCacheSubscribed  = Rejection{495, "project has no cache subscribed"}
	AlreadyConnected   = Rejection{496, "worker already connected"}
	WrongServerToken   = Rejection{401, "unknown worker id or wrong token"}
	MalformedMessage   = "malformed message"
	ReasonNoToken      = "no token provided"
	ReasonInvalidToken = "invalid token"
)

// Decide turns a Rejection into a Decision.
func (r Rejection) Decide() Decision { return Reject(r.Code, r.Reason) }
