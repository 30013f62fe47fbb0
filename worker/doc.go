// Package worker is the build machine's side: identity, peers, the
// connection life cycle (dialing with backoff, or dialed by a server), the
// job slot loop, and running jobs through an Executor.
//
//	id, err := worker.LoadID(baseDir, fixedID)
//	w, err := worker.New(worker.Config{ServerURL: url, WorkerID: id, PeersFile: f, Executor: exec, …})
//	err = w.Run(ctx) // until ctx ends: Draining, running jobs reported Canceled
package worker
