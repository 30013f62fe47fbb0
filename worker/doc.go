// Package worker is the build machine: identity, the job slot loop and
// running jobs through an Executor. The connection life cycle (dialing
// with backoff or dialed by a server, handshake, peers and reauth,
// heartbeat, Draining) is its workersession.Shell's; the Worker is the
// shell's Handler.
//
//	id, err := worker.LoadID(baseDir, fixedID)
//	w, err := worker.New(worker.Config{
//		Session:  workersession.Config{ServerURL: url, WorkerID: id, PeersFile: f, …},
//		Executor: exec, …})
//	err = w.Run(ctx) // until ctx ends: Draining, running jobs reported Canceled
package worker
