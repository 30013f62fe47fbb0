// Package workersession is the worker's end of a session, as authority
// is the server's: a Shell dials the server with reconnect backoff or is
// dialed by one, agrees the version, runs the handshake, holds the peers'
// tokens and reauths on their change, sends the heartbeat's
// WorkerMetrics and WorkerCapabilities, handles Draining and Reject, and
// on stop sends ClientDraining and closes. Everything else of each
// established session goes to a Handler: the build machine (package
// worker) or a tenant's hub behind the federation proxy (proxy/upstream).
//
//	sh, err := workersession.New(workersession.Config{ServerURL: url, WorkerID: id, PeersFile: f, …}, handler)
//	err = sh.Run(ctx) // until ctx ends: Draining, the handler's Stop, close
package workersession
