package server

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/internal/healthz"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/cache"
	"gradient.dev/gradient/server/dashboard"
	"gradient.dev/gradient/server/deploykeys"
	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/limit"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// Config is the server's configuration; zero values take the defaults of
// docs/protocol/connection.md.
type Config struct {
	// HeartbeatTimeout drops a worker session silent for this long
	// (proto.workerHeartbeatTimeoutSecs, 120 s). Negative disables it.
	HeartbeatTimeout time.Duration
	// SSH is the ssh program branch polls use for SSH repositories (""
	// = ssh from PATH).
	SSH string
	// AllowLocalRepositories lets projects name file:// URLs and local
	// paths: the admin API accepts them and branch polls read them.
	// Off, a project cannot make the server (or, through the job, a
	// worker) read repositories on its disk.
	AllowLocalRepositories bool
	// HandshakeTimeout bounds agreement and handshake (15 s).
	HandshakeTimeout time.Duration
	// Federate offers the reserved federate capability (proto.federate,
	// off): negotiated with workers that offer it, no behaviour yet.
	Federate bool
	// MaxConnections caps concurrent /proto sessions (proto.maxConnections,
	// 256); an upgrade beyond it gets HTTP 503.
	MaxConnections int
	// HandshakesPerIP caps the /proto sessions of one client IP that have
	// not finished the handshake (32); an upgrade beyond it gets HTTP 503.
	// All unauthenticated sessions together hold at most half of
	// MaxConnections, so idle sockets cannot starve the workers' slots.
	HandshakesPerIP int
	// AdminTokenHash is the hash (secret.Hash, or hex SHA-256) of the token
	// the admin API requires. Empty disables the admin API.
	AdminTokenHash string
	Logger         *slog.Logger
	// InstanceID names this server process among the instances sharing
	// one database (logs, worker sessions' claims); "" takes Instance's,
	// else a random one.
	InstanceID string
	// SessionLease is how long a worker session's claim outlives its
	// instance's last renewal on PostgreSQL (15 s): after an instance
	// died, its workers get in elsewhere once it has run out.
	// SessionRenewal is how often the claims are renewed (5 s).
	SessionLease   time.Duration
	SessionRenewal time.Duration

	// DialKey seals the tokens the server presents when it dials workers
	// (sealbox.OpenKeyFile of --dial-key-file). With a key, New starts
	// dialing every registration and team worker with a URL; without one,
	// a URL is refused with ErrNoDialKey.
	DialKey *sealbox.Box
	// DeployKeys are projects' deploy keys (deploykeys.New with DialKey),
	// made once by whoever opens the dial key and shared with the job
	// loop, which hands them out; nil: projects have none (generating
	// one answers deploykeys.ErrNoSecretKey).
	DeployKeys *deploykeys.Keys
	// DialTLS configures wss:// dials; nil uses the system roots.
	DialTLS *tls.Config
	// DialConnectTimeout bounds TCP, TLS and the upgrade of a dial (10 s).
	DialConnectTimeout time.Duration
	// DialBackoff is the first redial delay after a failure, doubling up
	// to DialMaxBackoff (1 s, 60 s). After a session the delay starts over.
	DialBackoff    time.Duration
	DialMaxBackoff time.Duration
	// DialRescan is how often the dial targets are read again, besides
	// RefreshDials (30 s).
	DialRescan time.Duration
	// DisableDialing is proto.discoverable=false: registrations and team
	// workers with a URL are kept (and still need DialKey) but never
	// dialed; the rescans only count them (gradient_server_dial_targets)
	// and give each the offline reason. Workers that connect themselves
	// are accepted as always.
	DisableDialing bool

	// NarStore holds the caches' compressed NARs. Nil serves narinfos
	// but answers 503 for NAR downloads and uploads.
	NarStore narstore.Store
	// NarPresign tunes presigned transfers when NarStore presigns (an S3
	// store): redirect or stream, multipart threshold, Pull URLs.
	NarPresign cache.PresignOptions
	// DisableAnonymousCache requires a cache API key on every read-only
	// cache session, public caches included
	// (proto.anonymousCache.enable = false).
	DisableAnonymousCache bool
	// AnonymousCacheSessionsPerIP caps anonymous cache sessions per client
	// IP (proto.anonymousCache.maxConnectionsPerIp, 32).
	AnonymousCacheSessionsPerIP int
	// AuthFailuresPerMinute is how many failed authentications (admin
	// token, cache API keys over HTTP and on cache sessions) one client
	// address may make per minute; beyond them its credentials are not
	// checked and it gets HTTP 429 until it regains attempts at that rate.
	// 0 takes the default 30; negative disables the limit.
	AuthFailuresPerMinute int
	// CacheSessionIdleTimeout closes a cache session that had no NAR
	// transfer for this long (120 s).
	CacheSessionIdleTimeout time.Duration

	// Jobs is the job loop behind worker sessions; nil answers job
	// requests with nothing (a cache-only server).
	Jobs authority.JobLoop
	// Metrics is the registry /metrics serves (shared with the job
	// loop; a binary adds the runtime collectors, metrics.NewRegistry);
	// nil makes a new one. The server's series must not be in it already:
	// give each server its own.
	Metrics *prometheus.Registry
	// PollInterval is how often each project's branch head is polled to
	// start evaluations (poller.go); 0 disables polling. It needs Jobs to
	// implement EvaluationControl.
	PollInterval time.Duration

	// ExternalURL is the server's address as forges and users reach it
	// (--external-url): webhook URLs and the commit statuses' links.
	ExternalURL string
	// ForgeHTTPClient talks to forges' APIs; nil: a 30 s timeout.
	ForgeHTTPClient *http.Client
	// ForgeStatusInterval is the status poster's periodic pass (5 s);
	// ForgeStatusMinBackoff its first wait after a failed post (2 s).
	ForgeStatusInterval   time.Duration
	ForgeStatusMinBackoff time.Duration

	// GCInterval is the period of automatic garbage collections of the
	// binary cache (0: only on demand); GCGrace spares uploads this recent;
	// KeepEvaluations is how many of a project's newest evaluations are
	// kept without a project setting (retention.DefaultKeep).
	GCInterval      time.Duration
	GCGrace         time.Duration
	KeepEvaluations int
	// gcPauseFile is retention's test hook (Config.PauseFile).
	GCPauseFile string

	// Instance is this process among the server instances sharing the
	// database (instance.Join): the branch polls, garbage collections and
	// forge status posts run on one instance at a time. Nil: the only one.
	Instance *instance.Instance

	// authClock, if set, is the failed-authentication limit's clock.
	authClock func() time.Time
}

func (c *Config) defaults() {
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = session.HandshakeTimeout
	}
	if c.AnonymousCacheSessionsPerIP <= 0 {
		c.AnonymousCacheSessionsPerIP = 32
	}
	if c.AuthFailuresPerMinute == 0 {
		c.AuthFailuresPerMinute = 30
	}
	if c.CacheSessionIdleTimeout <= 0 {
		c.CacheSessionIdleTimeout = 120 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.DialConnectTimeout <= 0 {
		c.DialConnectTimeout = session.ConnectTimeout
	}
	if c.DialBackoff <= 0 {
		c.DialBackoff = time.Second
	}
	if c.DialMaxBackoff < c.DialBackoff {
		c.DialMaxBackoff = max(60*time.Second, c.DialBackoff)
	}
	if c.DialRescan <= 0 {
		c.DialRescan = 30 * time.Second
	}
	if c.InstanceID == "" && c.Instance != nil {
		c.InstanceID = c.Instance.ID()
	}
	if c.InstanceID == "" {
		c.InstanceID = storage.NewID()
	}
	if c.SessionRenewal <= 0 {
		c.SessionRenewal = authority.DefaultClaimRenewal
	}
	if c.SessionLease < 2*c.SessionRenewal {
		c.SessionLease = 3 * c.SessionRenewal
	}
}

// Server is the Gradient server: the authority workers connect to, with
// the server's policy on its registrations, the binary cache, the admin
// API, the dialer of workers with a URL and the branch poller.
type Server struct {
	cfg     Config
	db      *storage.DB
	queue   *jobqueue.Queue // the branch poller's latest evaluations
	log     *slog.Logger
	metrics *serverMetrics
	// auth runs the worker sessions: admission through policy, the live
	// registry, reauth, the connection limits.
	auth *authority.Authority
	// verifier checks worker tokens: bounded argon2id work, and known
	// (hash, token) pairs remembered across reconnects.
	verifier *secret.Verifier

	dialer *dialer // nil without a dial key
	// deployKeys generates and opens projects' deploy keys, under the
	// dial key (Config.DeployKeys; nil without one).
	deployKeys *deploykeys.Keys
	// gate limits failed authentications per client address; nil when
	// disabled.
	gate *authgate.Gate
	// cache is the binary cache: HTTP, read-only cache sessions and the
	// cache messages of worker sessions.
	cache *cache.Cache
	// collector collects the cache's garbage (server/retention).
	collector *retention.Collector
	admin     *admin.API
	// forges: forge links, webhooks, the commit-status poster (forges.go).
	forges *forges
	// dashboard is the web dashboard at /.
	dashboard *dashboard.Dashboard
	// claims hold worker sessions across instances on PostgreSQL
	// (sessionclaims.go); nil on SQLite, a single instance.
	claims *sessionClaims

	// ctx ends the dialer and the poller on Close.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
}

// New builds a server on an opened database.
func New(db *storage.DB, cfg Config) *Server {
	cfg.defaults()
	ctx, cancel := context.WithCancelCause(context.Background())
	s := &Server{
		cfg:    cfg,
		db:     db,
		queue:  jobqueue.New(db),
		log:    cfg.Logger,
		ctx:    ctx,
		cancel: cancel,
	}
	if cfg.AuthFailuresPerMinute > 0 {
		s.gate = authgate.New(limit.NewFailures(cfg.AuthFailuresPerMinute, time.Minute, cfg.authClock), cfg.Logger)
	}
	s.metrics = newServerMetrics(cfg.Metrics)
	if cfg.Instance != nil {
		s.metrics.registry.MustRegister(cfg.Instance.InfoCollector())
	}
	var claims authority.Claims
	if db.Engine() == storage.EnginePostgres {
		s.claims = newSessionClaims(s)
		claims = s.claims
	}
	s.auth = authority.New(authority.Config{
		Claims:           claims,
		ClaimRenewal:     cfg.SessionRenewal,
		Instance:         cfg.InstanceID,
		Policy:           policy{s},
		Jobs:             cfg.Jobs,
		Cache:            s.workerCache,
		HeartbeatTimeout: cfg.HeartbeatTimeout,
		HandshakeTimeout: cfg.HandshakeTimeout,
		Federate:         cfg.Federate,
		MaxConnections:   cfg.MaxConnections,
		HandshakesPerIP:  cfg.HandshakesPerIP,
		Logger:           cfg.Logger,
		Metrics:          s.metrics.registry,
		MetricsPrefix:    "gradient_server",
	})
	s.cache = cache.New(cache.Config{
		DB: db, NarStore: cfg.NarStore, Sessions: s.auth, Gate: s.gate, Logger: cfg.Logger, Metrics: s.metrics.registry,
		HandshakeTimeout:            cfg.HandshakeTimeout,
		DisableAnonymousCache:       cfg.DisableAnonymousCache,
		AnonymousCacheSessionsPerIP: cfg.AnonymousCacheSessionsPerIP,
		CacheSessionIdleTimeout:     cfg.CacheSessionIdleTimeout,
		Presign:                     cfg.NarPresign,
	})
	if store := cfg.NarStore; store != nil {
		// A row that is an object's first reference needs the object
		// (docs/protocol/cache.md §10.1).
		db.SetObjectCheck(func(ctx context.Context, key string) error {
			_, err := store.Stat(ctx, key)
			if errors.Is(err, narstore.ErrNotFound) {
				return storage.ErrObjectMissing
			}
			return err
		})
	}
	s.collector = retention.New(retention.Config{
		DB: db, Store: cfg.NarStore, Content: s.cache, Interval: cfg.GCInterval, Grace: cfg.GCGrace,
		DefaultKeep: cfg.KeepEvaluations, Logger: cfg.Logger, Metrics: s.metrics.registry, PauseFile: cfg.GCPauseFile,
		Instances: cfg.Instance,
	})
	s.collector.Start(ctx)
	s.deployKeys = cfg.DeployKeys
	s.startForges()
	ctl, _ := s.evaluationControl()
	progress, _ := cfg.Jobs.(admin.BuildProgress)
	var instances admin.Instances // a nil *instance.Instance would be a non-nil interface
	if cfg.Instance != nil {
		instances = cfg.Instance
	}
	s.admin = admin.New(admin.Config{
		DB: db, AdminTokenHash: cfg.AdminTokenHash, Gate: s.gate, ObserveTokenCheck: s.metrics.argon2Checked,
		AllowLocalRepositories: cfg.AllowLocalRepositories, Logger: cfg.Logger,
		Workers: s, Dialer: s, DeployKeys: s.deployKeys, Cache: s.cache, Collector: s.collector, Evaluations: ctl, Progress: progress, Branches: s,
		Forges: s.forges.links, ExternalURL: cfg.ExternalURL, StatusesChanged: s.forges.poster.Nudge,
		Instances: instances,
	})
	s.dashboard = dashboard.New(dashboard.Config{DB: db, API: s.admin, Gate: s.gate, Workers: s, Logger: cfg.Logger})
	s.verifier = secret.NewVerifier(0)
	s.verifier.Observe = s.metrics.argon2Checked
	if cfg.DialKey != nil {
		s.dialer = newDialer(s)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.dialer.run(ctx)
		}()
	}
	s.startPoller()
	if s.claims != nil {
		s.wg.Go(func() { s.claims.listen(ctx) })
	}
	return s
}

// Metrics is the registry /metrics serves; the job loop adds its series.
func (s *Server) Metrics() *prometheus.Registry { return s.metrics.registry }

// Handler serves /proto, /healthz, /metrics, the admin API, the cache
// and, at every other path, the dashboard.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /proto", s.auth.ProtoHandler())
	mux.HandleFunc("GET /healthz", healthz.Handler(s.db.Ping))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
	s.admin.Mount(mux)
	s.mountForges(mux)
	s.cache.Mount(mux)
	mux.Handle("/", s.dashboard.Handler())
	return mux
}

// Close stops dialing and polling, ends every session at once (Server
// Stop) with 1001 and waits for their handlers to return
// (authority.Close).
func (s *Server) Close() {
	s.auth.Close()
	s.cancel(authority.ErrStopping)
	s.wg.Wait()
}

// SetAccepting starts or stops accepting worker connections. Sessions
// already up stay up; new ones are rejected with 403.
func (s *Server) SetAccepting(on bool) { s.auth.SetAccepting(on) }

// Accepting reports whether new worker sessions are accepted.
func (s *Server) Accepting() bool { return s.auth.Accepting() }

// ConfigWarnings are configuration problems the operator should see in
// `gradient server status`, e.g. an S3 store whose presigned URLs name a
// loopback address that workers on other machines cannot reach.
func (s *Server) ConfigWarnings() []string {
	var out []string
	if w, ok := s.cfg.NarStore.(interface{ Warnings() []string }); ok {
		out = append(out, w.Warnings()...)
	}
	return out
}

// GenerateDeployKey makes a new deploy key for the project, replacing any
// earlier one, and returns its public half (deploykeys.Keys.Generate).
func (s *Server) GenerateDeployKey(ctx context.Context, p storage.Project, comment string) (string, error) {
	return s.deployKeys.Generate(ctx, p, comment)
}

// Reauth reauthorizes the live session of a worker (authority.Reauth),
// wherever it lives: a session another instance holds is asked of that
// instance.
func (s *Server) Reauth(workerID string) bool {
	if s.auth.Reauth(workerID) {
		return true
	}
	if s.claims == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	asked, err := s.claims.ask(ctx, noteReauth, workerID, "")
	if err != nil {
		s.log.Warn("asking another instance to reauthorize the worker failed", "worker", workerID, "error", err)
	}
	return asked
}

// ShedUnauthenticated closes the oldest /proto session still in its
// handshake, for an HTTP listener out of file descriptors
// (httpguard.Listener); false when there is none.
func (s *Server) ShedUnauthenticated() bool { return s.auth.ShedUnauthenticated() }

// InstanceID names this server among the instances sharing its database.
func (s *Server) InstanceID() string { return s.cfg.InstanceID }
