package session

import (
	"context"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// A listener both workers and servers reach reads the first message
// (Conn.RecvFirst) and continues with one of these; only the tests run
// such a listener today.

// RunAuthorityGreeted is RunAuthority for a listener that already read the
// greeting.
func RunAuthorityGreeted(ctx context.Context, c *Conn, cfg AuthorityConfig, init *wire.InitConnection) (*Established, error) {
	m := handshake.NewAuthority(serverCaps(cfg.Capabilities))
	m.Start()
	return drive(ctx, c, m, m.Received(init), cfg.Timeout, authorityAsk(cfg.Policy))
}

// RunDialedAuthenticated answers the dialer after the listener read the
// Authenticate itself.
func RunDialedAuthenticated(ctx context.Context, c *Conn, cfg DialedConfig, auth *wire.Authenticate) (*Established, error) {
	m := handshake.NewDialed(cfg.WorkerID, cfg.Capabilities)
	m.Start()
	return drive(ctx, c, m, m.Received(auth), cfg.Timeout, dialedAsk(cfg.Verifier))
}
