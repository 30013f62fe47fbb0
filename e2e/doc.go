// Package e2e holds end-to-end tests of the binaries as an operator runs
// them: real gradient-server, gradient-proxy and gradient-worker
// processes on loopback (internal/proxyworld), driven through their admin
// APIs and the gradient CLI. It has no code of its own.
package e2e
