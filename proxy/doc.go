// Package proxy is the federation proxy: an authority to its own worker
// pool and a worker to each tenant's server (docs/protocol/federation.md).
package proxy
