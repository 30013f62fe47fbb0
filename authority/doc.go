// Package authority runs the authority side of worker sessions: it accepts
// the connections workers dial and serves the ones its owner dialed, asks a
// Policy who may hold a session and what it may do, keeps one live session
// per worker ID (496 for a second), their heartbeat, draining and offline
// reasons, and runs reauths. The Gradient server plugs in its storage-backed
// policy, its job loop and its binary cache; the federation proxy's
// downstream leg plugs in its own rows and a passthrough to the tenant.
//
// A server builds one Authority from a Config and mounts ProtoHandler at
// /proto:
//
//	a := authority.New(authority.Config{Policy: p, Jobs: loop, Cache: c.ForSession})
//	mux.Handle("GET /proto", a.ProtoHandler())
//	defer a.Close()
//
// The package knows no database, no cache and no scheduler: everything it
// needs of them comes through Policy, DialedPolicy, JobLoop and
// CacheFactory (deps_test.go keeps it so).
//
// Lock order: the registry's mutex (liveSessions.mu) and a session's
// mutex (workerConn.mu) are never held together. Code that needs both
// copies what it needs out of one, unlocks it, then takes the other.
package authority
