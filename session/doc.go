// Package session carries protocol messages over WebSocket: version
// agreement, the pure handshake state machine in its four roles (authority,
// dialer, peer, dialed), reauth, and the split into a typed reader and a
// two-lane writer. The server, the worker, cache sessions and both legs of
// the proxy use it unchanged.
package session
