// Package handshake is the pure handshake state machine of the worker
// protocol (docs/protocol/session.md §4): no I/O, no clocks, no policy. A driver feeds it
// what arrived (Received, Lost) and what policy answered (Challenged,
// Decided, Verified); every call returns the next Step: a message to send,
// then what to do next (read, ask policy, done, fail).
//
// One Machine type drives all four roles:
//
//	Authority  server, worker dialed in:  ← InitConnection → AuthChallenge ← AuthResponse → InitAck
//	Dialer     server dialing a worker:   → Authenticate ← InitConnection → InitAck
//	Peer       worker dialing the server: → InitConnection ← AuthChallenge → AuthResponse ← InitAck
//	Dialed     worker answering a dial:   ← Authenticate → InitConnection ← InitAck
package handshake
