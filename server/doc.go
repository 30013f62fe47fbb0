// Package server is the Gradient server: it builds the authority
// (gradient.dev/gradient/authority) with the server's policy on its
// registrations (policy.go, authorize.go), dials the workers registered
// with a URL (dial*.go), polls projects' branches (poller.go), and serves
// the binary cache (cache_*.go) and the admin API (admin_*.go) beside
// /proto. The job loop is server/scheduler, plugged in as the authority's
// JobLoop; projects' deploy keys are server/deploykeys.
package server
