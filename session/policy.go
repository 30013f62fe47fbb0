package session

import (
	"context"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// Authority is the server's (or the proxy's) policy for workers dialing in.
type Authority interface {
	// Challenge lists the peers that registered workerID; empty in open
	// modes. An error aborts the handshake.
	Challenge(ctx context.Context, workerID string) ([]string, error)
	// Authorize checks the tokens the worker answered with (secrets: never
	// log them) and decides. It is also used for reauth.
	Authorize(ctx context.Context, workerID string, tokens []wire.Pair[string, string]) (handshake.Decision, error)
}

// Admitter is the server's policy for a worker it dialed itself: the
// worker proved itself with its TLS certificate, the server with its tokens.
type Admitter interface {
	Admit(ctx context.Context, workerID string, offered wire.GradientCapabilities) (handshake.Decision, error)
}

// ServerVerifier is a dialed worker's check of the dialing server's tokens
// (against its accepted-server-tokens file).
type ServerVerifier interface {
	VerifyServer(workerID string, tokens []wire.Pair[string, string]) bool
}

// AcceptAnyServer is the verifier of a worker without an accepted-server-
// tokens file: every server is accepted.
type AcceptAnyServer struct{}

func (AcceptAnyServer) VerifyServer(string, []wire.Pair[string, string]) bool { return true }
