// Package cache is the Gradient server's binary cache: the plain Nix
// cache over HTTP (nix-cache-info, signed narinfos, NARs with ranges) and
// read-only cache sessions at /cache/{cache}/proto; on worker sessions
// the cache messages (CacheQuery, NarRequest with resume, uploads with
// their scope and leases, known derivations); the narinfo memo; and the
// cache content the admin API manages (pushes, deletes).
//
// The cache knows the authority only through Sessions, and a worker
// session only through the Scope and send function its Conn is given.
package cache

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/limit"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// Sessions is what the cache needs of the authority (authority.Authority
// implements it): read-only cache sessions count against its connection
// limit and end when it closes.
type Sessions interface {
	// TakeSlot takes a connection slot; false when none is free.
	TakeSlot() (release func(), ok bool)
	// Refused counts a connection refused before its handshake.
	Refused(reason string)
	// Attach runs f until it returns; ctx ends when the authority closes.
	Attach(f func(ctx context.Context))
}

// Config is the cache's configuration; zero values take the defaults.
type Config struct {
	DB *storage.DB
	// NarStore holds the caches' compressed NARs. Nil serves narinfos
	// but answers 503 for NAR downloads and uploads.
	NarStore narstore.Store
	// Sessions is the authority the read-only cache sessions run under.
	Sessions Sessions
	// Gate holds back addresses with too many wrong cache API keys; nil
	// holds back nobody.
	Gate   *authgate.Gate
	Logger *slog.Logger
	// Metrics takes the cache's series (gradient_cache_…); nil registers
	// them nowhere.
	Metrics prometheus.Registerer
	// HandshakeTimeout bounds a cache session's agreement and handshake
	// (15 s).
	HandshakeTimeout time.Duration
	// DisableAnonymousCache requires a cache API key on every read-only
	// cache session, public caches included
	// (proto.anonymousCache.enable = false).
	DisableAnonymousCache bool
	// AnonymousCacheSessionsPerIP caps anonymous cache sessions per client
	// IP (proto.anonymousCache.maxConnectionsPerIp, 32).
	AnonymousCacheSessionsPerIP int
	// CacheSessionIdleTimeout closes a cache session that had no NAR
	// transfer for this long (120 s).
	CacheSessionIdleTimeout time.Duration
	// Presign tunes presigned transfers, used when NarStore is a
	// narstore.Presigner.
	Presign PresignOptions
}

func (c *Config) defaults() {
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = session.HandshakeTimeout
	}
	if c.AnonymousCacheSessionsPerIP <= 0 {
		c.AnonymousCacheSessionsPerIP = 32
	}
	if c.CacheSessionIdleTimeout <= 0 {
		c.CacheSessionIdleTimeout = 120 * time.Second
	}
	if c.Presign.MultipartThreshold <= 0 {
		c.Presign.MultipartThreshold = 1 << 30
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
	}
}

// PresignOptions tune presigned transfers (docs/protocol/cache.md §4.5).
type PresignOptions struct {
	// StreamNars serves the HTTP cache's NARs through the server instead
	// of redirecting to a presigned GET.
	StreamNars bool
	// StreamUploads grants Passthrough instead of presigned URLs.
	StreamUploads bool
	// MultipartThreshold: uploads of NARs larger than this get a
	// Multipart grant, smaller ones a single Put (1 GiB).
	MultipartThreshold int64
	// PullURLMinBytes: Pull answers carry a presigned GET url only for
	// objects larger than this; 0 (the zero value, so also unset) or
	// negative: for every object, so no NAR byte of a worker's pull
	// crosses the server or a federation proxy (docs/protocol/cache.md
	// §2.1).
	PullURLMinBytes int64
}

// Cache is the binary cache of one server.
type Cache struct {
	cfg      Config
	db       *storage.DB
	queue    *jobqueue.Queue // the builds' derivations (BuiltDerivations)
	log      *slog.Logger
	metrics  *binaryCacheMetrics
	gate     *authgate.Gate
	sessions Sessions
	// anonymousCache caps anonymous read-only cache sessions per IP.
	anonymousCache *limit.PerIP
	uploadLeases   *uploadLeases
	// cacheMemo keeps cache rows, signing keys and narinfos; the admin
	// API's deletes forget what they delete.
	cacheMemo *cacheMemo
	// subscriptions keeps projects' subscribed caches; the admin API
	// reports every change.
	subscriptions *subscriptionMemo
	// presigner is NarStore when it presigns, else nil.
	presigner narstore.Presigner
	// served notes when narinfos were served (FlushServed).
	served servedBatch
}

// New builds the cache; it registers its series on cfg.Metrics.
func New(cfg Config) *Cache {
	cfg.defaults()
	c := &Cache{
		cfg:            cfg,
		db:             cfg.DB,
		queue:          jobqueue.New(cfg.DB),
		log:            cfg.Logger,
		metrics:        newBinaryCacheMetrics(),
		gate:           cfg.Gate,
		sessions:       cfg.Sessions,
		anonymousCache: limit.NewPerIP(cfg.AnonymousCacheSessionsPerIP),
		uploadLeases:   newUploadLeases(),
		cacheMemo:      newCacheMemo(),
		subscriptions:  newSubscriptionMemo(),
	}
	c.presigner, _ = cfg.NarStore.(narstore.Presigner)
	for _, m := range c.metrics.collectors() {
		cfg.Metrics.MustRegister(m)
	}
	return c
}
