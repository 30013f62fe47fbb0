// Package server is the Gradient server. It builds the authority
// (gradient.dev/gradient/authority) with the server's policy on its
// registrations (policy.go, authorize.go) and its binary cache
// (server/cache) as every session's cache handler, dials the workers
// registered with a URL (dial*.go, dialcred.go), polls projects' branches
// (poller.go), and mounts /proto, the cache, the admin API (server/admin)
// and /metrics on one handler. The job loop (server/scheduler) plugs in
// through Config.Jobs; projects' deploy keys are server/deploykeys.
package server
