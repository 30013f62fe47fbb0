// Package daemon is a client of the Nix daemon's worker protocol: the
// binary protocol `nix` itself speaks to /nix/var/nix/daemon-socket/socket
// or to `nix-daemon --stdio`.
//
// It negotiates protocol versions 1.34 (Nix 2.8) to 1.38, and implements
// the operations a Gradient worker needs: path queries, NAR export and
// import, builds with their log and GC roots. QueryMissing is here and
// tested, but the worker does not use it: what a job must pull is
// QueryValidPaths' question (which wanted paths the store lacks), while
// QueryMissing walks a derivation's closure and names derivations to
// build, ≈ 6× slower (docs/PERFORMANCE.md, "Worker on the Nix daemon").
// A Client
// keeps a few long-lived connections; an operation holds one until its
// reply is read, and a connection that broke is replaced on the next
// operation.
//
// Wire format: every integer is a little-endian uint64; a string is its
// length, its bytes and zero padding to a multiple of 8; a list is its
// count and its items. Replies are preceded by log messages (the "stderr"
// loop, see stderr.go) that end in STDERR_LAST or STDERR_ERROR.
package daemon
