package workersession

import "gradient.dev/gradient/wire"

// Handler is the job side of a worker's sessions: the build runner
// (package worker: slots, executor, cache client) or the proxy's hub
// (proxy/upstream). The shell keeps each session itself — dialing or
// being dialed, version agreement, handshake, reauth, the heartbeat's
// WorkerMetrics, WorkerCapabilities at start and on HostChanged,
// Draining and Reject, the stop's ClientDraining and close, reconnect
// backoff — and hands the handler everything else.
type Handler interface {
	// Host is the WorkerCapabilities a session that may build reports
	// at its start and on Shell.HostChanged.
	Host() wire.WorkerCapabilities
	// Load is the WorkerMetrics of each heartbeat and of HostChanged.
	Load() *wire.WorkerMetrics
	// Open is called once per established session, before its first
	// message is dispatched; the SessionHandler it returns serves that
	// session alone.
	Open(s *Session) SessionHandler
}

// SessionHandler serves one established session. Start, Handle and
// Ended run on the session's reader goroutine, in that order, so Handle
// must not block on the network; Tick runs on the heartbeat's goroutine
// and Stop on the stop sequence's.
type SessionHandler interface {
	// Start sends the handler's part of the session-start sequence,
	// after the shell's WorkerCapabilities (a worker's RequestJobList
	// and RequestJobs).
	Start()
	// Handle takes one server message, in order: every message but the
	// reauth exchange (AuthChallenge, AuthUpdate, the reauth's answer),
	// which the shell answers itself. ServerDraining and ServerReject
	// come after the shell logged them and marked the session drained.
	// Byte fields alias the received frame; a NarPush's or
	// EvalCacheChunk's frame is reused only after Session.Release, every
	// other message's frame is never reused.
	Handle(m wire.ServerMessage)
	// Tick is each heartbeat, after the shell's WorkerMetrics.
	Tick()
	// Stop is the worker stopping (docs/protocol/jobs.md §12.3): the
	// session is Stopping and ClientDraining went out; Stop returns when
	// what runs on the session finished or was ended and reported, and
	// the shell then closes the session.
	Stop()
	// Ended: the session is gone (lost, closed, drained or the worker
	// stopping, then Stop may still run); no Handle follows.
	Ended(reason string)
}
