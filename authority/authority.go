package authority

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/session/limit"
	"gradient.dev/gradient/wire"
)

// Config is an authority's configuration; zero values take the defaults of
// docs/protocol/connection.md.
type Config struct {
	// Policy decides the sessions workers dial (ProtoHandler, ServeWorker).
	Policy Policy
	// Jobs is the job loop behind worker sessions; nil is NoJobs.
	Jobs JobLoop
	// Cache answers the cache messages of each session; nil ignores them.
	Cache CacheFactory

	// HeartbeatTimeout drops a worker session silent for this long
	// (proto.workerHeartbeatTimeoutSecs, 120 s). Negative disables it.
	HeartbeatTimeout time.Duration
	// HandshakeTimeout bounds agreement and handshake (15 s).
	HandshakeTimeout time.Duration
	// Federate offers the reserved federate capability (proto.federate,
	// off): negotiated with workers that offer it, no behaviour yet.
	Federate bool
	// MaxConnections caps concurrent sessions (proto.maxConnections, 256).
	// Sessions that have not finished the handshake hold at most half of
	// it; the rest is kept for sessions past the handshake.
	MaxConnections int
	// HandshakesPerIP caps the unauthenticated sessions of one address
	// prefix (an IPv4 /24, an IPv6 /64; 32). Past this or the half of
	// MaxConnections, the oldest unauthenticated session (of the prefix,
	// else of the prefix holding the most) is closed to admit the new
	// one; an upgrade gets HTTP 503 only when every session is past its
	// handshake or checking its credentials (limit.Budget).
	HandshakesPerIP int
	Logger          *slog.Logger
	// Claims keeps one session per worker ID across the server instances
	// sharing a database; nil: this authority is the only one.
	Claims Claims
	// ClaimRenewal is how often Claims are renewed
	// (DefaultClaimRenewal); the lease must outlast several renewals.
	ClaimRenewal time.Duration
	// Instance names this server instance in WorkerStatus.
	Instance string
	// Metrics takes the authority's series; nil registers them nowhere.
	Metrics prometheus.Registerer
	// MetricsPrefix starts every series name ("gradient_server").
	MetricsPrefix string
}

func (c *Config) defaults() {
	if c.Jobs == nil {
		c.Jobs = NoJobs{}
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 120 * time.Second
	}
	if c.HeartbeatTimeout < 0 {
		c.HeartbeatTimeout = 0
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = session.HandshakeTimeout
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = 256
	}
	if c.HandshakesPerIP <= 0 {
		c.HandshakesPerIP = 32
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ClaimRenewal <= 0 {
		c.ClaimRenewal = DefaultClaimRenewal
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
	}
	if c.MetricsPrefix == "" {
		c.MetricsPrefix = "gradient_server"
	}
}

// CacheFactory makes the cache-message handler of one established
// session: the server's binary cache, or the proxy's passthrough to the
// tenant's server.
type CacheFactory func(s CacheSession) CacheHandler

// CacheSession is what a cache handler gets of its session.
type CacheSession struct {
	// Ctx ends when the authority closes.
	Ctx    context.Context
	Log    *slog.Logger
	Worker *LiveWorker
}

// CacheHandler answers one session's cache messages (wire.ClassCache). Its
// answers go through the session's LiveWorker.Send.
type CacheHandler interface {
	// Handle takes one cache message; it must not block on the network.
	// An UploadChunk's payload must have been consumed when it returns:
	// the session reuses its frame.
	Handle(m wire.ClientMessage)
	// Close ends the session's transfers and waits for them; it is called
	// once the session has ended.
	Close()
}

// Authority accepts and serves worker sessions.
type Authority struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics

	live      *liveSessions
	offline   *offlineReasons
	accepting atomic.Bool
	// budget holds every /proto session and cache session (TakeSlot):
	// MaxConnections in all, half of it for unauthenticated ones.
	budget *limit.Budget

	// ctx ends every session at once on Close (SIGTERM); its cause,
	// ErrStopping, is the reason of the close frames it triggers.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	// closeMu orders every wg.Add before Close's Wait: a handshake that
	// arrives while Close runs is refused instead of racing it.
	closeMu sync.Mutex
	closed  bool
	// stopRenewal ends the claims' renewal once Close has drained every
	// session (nil without Claims); renewalDone closes when it has.
	stopRenewal chan struct{}
	renewalDone chan struct{}
	stopOnce    sync.Once
}

// New builds an authority; it accepts sessions until Close.
func New(cfg Config) *Authority {
	cfg.defaults()
	ctx, cancel := context.WithCancelCause(context.Background())
	a := &Authority{
		cfg:     cfg,
		log:     cfg.Logger,
		live:    newLiveSessions(),
		offline: newOfflineReasons(),
		budget:  limit.NewBudget(cfg.MaxConnections, cfg.MaxConnections/2, cfg.HandshakesPerIP),
		ctx:     ctx,
		cancel:  cancel,
	}
	a.metrics = newMetrics(a)
	a.accepting.Store(true)
	if cfg.Claims != nil {
		a.stopRenewal, a.renewalDone = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(a.renewalDone)
			a.renewClaims(a.stopRenewal)
		}()
	}
	return a
}

// ErrStopping ends the authority's context on Close.
var ErrStopping = errors.New("server stopping")

// Close ends every session at once (Server Stop) with 1001 and waits for
// the handlers of ProtoHandler, ServeWorker and Attach to return.
// Established sessions are closed before the context ends, so their
// queued messages drain first; the context then ends handshakes (and
// whatever closeAll missed) with 1001 too.
func (a *Authority) Close() {
	a.accepting.Store(false)
	a.live.closeAll(ErrStopping.Error())
	a.cancel(ErrStopping)
	a.closeMu.Lock()
	a.closed = true
	a.closeMu.Unlock()
	a.wg.Wait()
	if a.stopRenewal != nil {
		// Renewed while the sessions drained; each released its claim.
		a.stopOnce.Do(func() { close(a.stopRenewal) })
		<-a.renewalDone
	}
}

// enter counts a handler Close waits for; false once Close has begun, when
// the handler must not start.
func (a *Authority) enter() bool {
	a.closeMu.Lock()
	defer a.closeMu.Unlock()
	if a.closed {
		return false
	}
	a.wg.Add(1)
	return true
}

// Attach runs f, which serves a connection outside the worker sessions
// (a read-only cache session), under the authority: ctx ends on Close,
// and Close waits for f to return.
func (a *Authority) Attach(f func(ctx context.Context)) {
	if !a.enter() {
		f(a.ctx) // already cancelled: f sees the authority stopping
		return
	}
	defer a.wg.Done()
	f(a.ctx)
}

// SetAccepting starts or stops accepting worker connections. Sessions
// already up stay up; new ones are rejected with 403.
func (a *Authority) SetAccepting(on bool) {
	a.accepting.Store(on)
	a.log.Info("worker connections", "accepting", on)
}

// Accepting reports whether new worker sessions are accepted.
func (a *Authority) Accepting() bool { return a.accepting.Load() }

// Connected is how many worker sessions are up or handshaking.
func (a *Authority) Connected() int { return a.live.count() }

// TakeSlot takes one of the MaxConnections places for a session about to
// start outside the worker sessions' handshake limits (a read-only cache
// session); false (counted as refused) when none is free. Refusing beats
// queueing.
func (a *Authority) TakeSlot() (release func(), ok bool) {
	release, ok = a.budget.TakeEstablished()
	if !ok {
		a.Refused(limit.ReasonTotal)
	}
	return release, ok
}

// ShedUnauthenticated closes the oldest worker session that has not
// finished its handshake (of the address prefix holding the most), for an
// HTTP server that is out of file descriptors; false when there is none.
func (a *Authority) ShedUnauthenticated() bool {
	if !a.budget.ShedOldest() {
		return false
	}
	a.metrics.shed.WithLabelValues("file limit").Inc()
	return true
}

// Refused counts a connection refused before its handshake, by reason.
func (a *Authority) Refused(reason string) { a.metrics.refused.WithLabelValues(reason).Inc() }

// HandshakeTimeout bounds agreement and handshake of every session.
func (a *Authority) HandshakeTimeout() time.Duration { return a.cfg.HandshakeTimeout }

// capabilities are the authority's own in every worker handshake.
func (a *Authority) capabilities() *wire.GradientCapabilities {
	c := handshake.ServerCapabilities(a.cfg.Federate)
	return &c
}
