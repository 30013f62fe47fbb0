package worker

import (
	"log/slog"

	"gradient.dev/gradient/wire"
)

// Forwarder, set as Config.Forwarder, takes over the job side of every
// established session: a federation proxy forwards the server's jobs to
// the workers behind it instead of running them. The worker keeps the
// session itself — handshake, reauth, heartbeat with WorkerMetrics,
// WorkerCapabilities at start and on HostChanged, reconnect backoff,
// Reject handling — and hands the embedder everything else: offers
// (JobOffer, JobListChunk), AssignJob, Credential, AbortJob, the cluster
// messages, every cache answer and NAR frame, ImportResult, Error and
// Draining. The worker then never polls (RequestJob, RequestJobList come
// from the embedder), never scores and never answers an AssignJob.
//
// Forward is called once per established session, before its first
// message is dispatched; the returned handler gets that session's
// messages in order, from the session's reader goroutine, so Handle must
// not block on the network.
type Forwarder interface {
	Forward(s ForwardedSession) ForwardHandler
}

// ForwardedSession is what a Forwarder gets of one established session.
type ForwardedSession struct {
	// Send queues a message on the session (both lanes as usual); it
	// fails once the session is gone.
	Send func(wire.ClientMessage) error
	// Version is the agreed protocol version.
	Version uint16
	// Capabilities are the negotiated capabilities.
	Capabilities    wire.GradientCapabilities
	AuthorizedPeers []string
	Log             *slog.Logger
}

// ForwardHandler receives one forwarded session's messages.
type ForwardHandler interface {
	// Handle takes one server message. Byte fields alias the received
	// frame. The frame of a NarPush or EvalCacheChunk receives a later
	// message once Handle returns, so their Data is valid only until then
	// (encode or copy it); every other message's frame is never reused
	// and the handler may keep its byte fields.
	Handle(m wire.ServerMessage)
	// Ended: the session is gone (lost, closed, drained or the worker
	// stopping); no Handle follows.
	Ended(reason string)
}
