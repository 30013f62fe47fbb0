package authority

import (
	"context"
	"net"
)

type remoteKey struct{}

// RemoteAddr is the source address (the host, without the port) of the
// worker-dialed connection whose handshake or reauth a Policy's Authorize
// is deciding; "" when the authority was not told one. A policy may bind
// a credential to it (the proxy binds a Hetzner VM's one-time token to
// the address of its first handshake).
func RemoteAddr(ctx context.Context) string {
	addr, _ := ctx.Value(remoteKey{}).(string)
	return addr
}

// withRemote gives ctx the host part of remote (as ServeWorker got it).
func withRemote(ctx context.Context, remote string) context.Context {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		remote = host
	}
	return context.WithValue(ctx, remoteKey{}, remote)
}
