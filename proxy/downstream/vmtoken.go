package downstream

import (
	"context"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// vmTokens is the leg's policy with one more rule for Hetzner VMs'
// workers, whose token travels in the VM's user data: the token is
// one-time. The first handshake it passes binds it to that handshake's
// source address (proxystore.BindVMWorker); later handshakes and
// reauths are accepted only from that address and only while the VM's
// row is open, so the VM's own worker reconnects while a copy of the
// token used from anywhere else is refused. The protocol has no way to
// hand a worker a new token, so the binding stands in for an exchange.
type vmTokens struct{ *Leg }

// Authorize is the leg's Authorize, then the VM rule on its accepted
// grants.
func (p vmTokens) Authorize(ctx context.Context, workerID string, tokens []wire.Pair[string, string]) (authority.Grant, error) {
	g, err := p.Leg.Authorize(ctx, workerID, tokens)
	if err != nil || g.Rejected() {
		return g, err
	}
	addr := authority.RemoteAddr(ctx)
	b, err := p.store.BindVMWorker(ctx, g.WorkerID, addr)
	if err != nil {
		return authority.Grant{}, err
	}
	if !b.VM || b.Accepted {
		return g, nil
	}
	p.log.Warn("refused a Hetzner VM's worker token: it is bound to the address of the VM's first handshake",
		"worker", g.WorkerID, "remote", addr, "bound_to", b.BoundTo)
	return authority.Grant{Decision: handshake.NoValidTokens.Decide(), WorkerID: g.WorkerID, Known: true}, nil
}
