// Package worker is the build machine's side: identity, peers, reconnects,
// and running fetch, eval and build jobs through package nix.
package worker
