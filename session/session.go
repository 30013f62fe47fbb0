package session

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"gradient.dev/gradient/wire"
)

// Options configure a split session. Zero values disable the watchdogs, so
// callers opt in with HeartbeatTimeout / AckTimeout (or shorter test values).
type Options struct {
	// SendTimeout bounds a send's wait for lane space (0: DefaultSendTimeout).
	SendTimeout time.Duration
	// HeartbeatTimeout (server side): close a session no message arrived
	// on for this long. 0 disables.
	HeartbeatTimeout time.Duration
	// AckTimeout (worker side): close a session whose sent data the peer
	// has not acknowledged for this long, probed with WebSocket pings.
	// 0 disables; transports without pings ignore it.
	AckTimeout time.Duration
	// PingInterval is how often the ack probe runs (0: AckTimeout/4).
	PingInterval time.Duration
	// DrainTimeout bounds how long Close lets queued messages go out
	// (0: one second).
	DrainTimeout time.Duration
	Logger       *slog.Logger
}

// Session is an established, split connection: a single-owner Reader of In
// and a shared Writer of Out.
type Session[In, Out wire.Message] struct {
	Established
	Reader *Reader[In]
	Writer *Writer[Out]

	t     Transport
	log   *slog.Logger
	drain time.Duration

	closeOnce sync.Once
	done      chan struct{}
	reason    string // why the session ended, set before done closes
	stopWatch func()
}

// ServerSession is the server's end: it reads ClientMessages and sends
// ServerMessages.
type ServerSession = Session[wire.ClientMessage, wire.ServerMessage]

// WorkerSession is the worker's end: it reads ServerMessages and sends
// ClientMessages.
type WorkerSession = Session[wire.ServerMessage, wire.ClientMessage]

// SplitServer splits a handshaken connection on the server side.
func SplitServer(c *Conn, est *Established, opts Options) *ServerSession {
	return split(c, est, ClientCodec, ServerCodec, opts)
}

// SplitWorker splits a handshaken connection on the worker side.
func SplitWorker(c *Conn, est *Established, opts Options) *WorkerSession {
	return split(c, est, ServerCodec, ClientCodec, opts)
}

func split[In, Out wire.Message](c *Conn, est *Established, in Codec[In], out Codec[Out], opts Options) *Session[In, Out] {
	log := logger(opts.Logger)
	if opts.Logger == nil {
		log = c.log
	}
	log = log.With("worker", est.WorkerID)
	s := &Session[In, Out]{
		Established: *est,
		Reader:      NewReader(c.t, c.ver, in, log),

		t:     c.t,
		log:   log,
		drain: opts.DrainTimeout,
		done:  make(chan struct{}),
	}
	s.Writer = newWriter(c.t, c.ver, out, opts.SendTimeout, log, func(err error) {
		s.end(CloseNormal, "", "write failed: "+err.Error(), false, true)
	})
	if s.drain <= 0 {
		s.drain = time.Second
	}
	// Watchdogs are created disarmed and armed only once s is complete,
	// since they may end the session at any moment.
	var arms, stops []func()
	if opts.HeartbeatTimeout > 0 {
		arm, stop := watchHeartbeat(s.Reader.idleFor, opts.HeartbeatTimeout, s.expire)
		arms, stops = append(arms, arm), append(stops, stop)
	}
	if p, ok := c.t.(pinger); ok && opts.AckTimeout > 0 {
		arm, stop := watchAcks(p, opts.AckTimeout, opts.PingInterval, s.expire)
		arms, stops = append(arms, arm), append(stops, stop)
	}
	s.stopWatch = func() {
		for _, stop := range stops {
			stop()
		}
	}
	for _, arm := range arms {
		arm()
	}
	return s
}

// Version is the agreed protocol version.
func (s *Session[In, Out]) Version() uint16 { return s.Established.Version }

// Recv is Reader.Recv; at the end of the stream it also ends the session
// (stopping the writer and the watchdogs). Only the dispatch loop calls it.
func (s *Session[In, Out]) Recv(ctx context.Context) (In, error) {
	m, err := s.Reader.Recv(ctx)
	if err != nil {
		s.end(CloseNormal, "", "receive ended: "+err.Error(), false, true)
	}
	return m, err
}

// Send is Writer.Send.
func (s *Session[In, Out]) Send(m Out) error { return s.Writer.Send(m) }

// Close lets queued messages go out (bounded by the drain timeout), then
// closes the connection with code and reason.
func (s *Session[In, Out]) Close(code int, reason string) {
	s.end(code, reason, "closed: "+reason, true, true)
}

// Done is closed once the session ended.
func (s *Session[In, Out]) Done() <-chan struct{} { return s.done }

// Reason is why the session ended (valid after Done), e.g. a heartbeat
// timeout.
func (s *Session[In, Out]) Reason() string {
	select {
	case <-s.done:
		return s.reason
	default:
		return ""
	}
}

// Probe proves the peer still reads the session: a WebSocket ping
// answered within ctx. Transports without pings cannot tell and report
// nil.
func (s *Session[In, Out]) Probe(ctx context.Context) error {
	p, ok := s.t.(pinger)
	if !ok {
		return nil
	}
	return p.Ping(ctx)
}

// Drop ends the session at once with 1008 and reason, for a peer that
// stopped answering: queued messages are discarded and the peer's close
// frame is not waited for.
func (s *Session[In, Out]) Drop(reason string) { s.expire(reason) }

func (s *Session[In, Out]) expire(reason string) {
	s.log.Warn("dropping session", "reason", reason)
	s.end(ClosePolicy, reason, reason, false, false)
}

// end ends the session once. peerAnswers false: the peer stopped reading
// (a watchdog or a probe said so), so its close frame is not waited for.
func (s *Session[In, Out]) end(code int, closeReason, why string, drain, peerAnswers bool) {
	s.closeOnce.Do(func() {
		s.stopWatch()
		if drain {
			s.Writer.Close()
			select {
			case <-s.Writer.Done():
			case <-time.After(s.drain):
			}
		}
		s.reason = why
		// The close is claimed before the writer is aborted: aborting a
		// write in progress closes the socket, and the peer must see this
		// code, not the abort's.
		if peerAnswers {
			closeAsync(s.t, code, closeReason)
		} else {
			abandon(s.t, code, closeReason)
		}
		s.Writer.Abort()
		close(s.done)
	})
}
