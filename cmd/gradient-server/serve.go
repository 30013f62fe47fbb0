package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/metrics"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/cache"
	"gradient.dev/gradient/server/deploykeys"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
)

const (
	// shutdownTimeout bounds the wait for in-flight admin and metrics
	// requests after the worker sessions were closed.
	shutdownTimeout = 10 * time.Second
)

// serve opens the database, runs the server until ctx ends, then stops:
// every worker session at once (Server.Close), then the HTTP server.
// ready, when set, learns the bound address (tests listen on port 0).
func serve(ctx context.Context, opts options, log *slog.Logger, ready func(net.Addr)) error {
	adminHash := ""
	if opts.AdminToken != "" {
		var err error
		if adminHash, err = secret.Hash(opts.AdminToken); err != nil {
			return err
		}
	} else {
		log.Warn("no admin token configured: the admin API answers 503 (set --admin-token-file or GRADIENT_ADMIN_TOKEN_FILE)")
	}
	opts.AdminToken = "" // only the hash lives on

	var dialKey *sealbox.Box
	if opts.DialKeyFile != "" {
		var err error
		if dialKey, err = sealbox.OpenKeyFile(opts.DialKeyFile); err != nil {
			return fmt.Errorf("dial key: %w", err)
		}
	}

	db, err := storage.Open(ctx, opts.Database)
	if err != nil {
		return err
	}
	defer db.Close()
	// Before anything writes: a configuration the other instances do not
	// share is refused here.
	inst, err := joinInstances(ctx, db, opts, log)
	if err != nil {
		return err
	}
	defer func() {
		leaveCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := inst.Leave(leaveCtx); err != nil {
			log.Warn("server instance: removing its row failed (it expires with its lease)", "error", err)
		}
	}()
	if err := sealSigningKeys(ctx, db, dialKey, log); err != nil {
		return err
	}

	heartbeat := opts.HeartbeatTimeout
	if heartbeat == 0 {
		heartbeat = -1 // server.Config: negative disables, zero means the default
	}
	nars, narWhere, err := openNarStore(ctx, opts, log)
	if err != nil {
		return err
	}
	// The job loop recovers what a previous run left open before the
	// first worker session can report anything.
	registry := metrics.NewRegistry() // with the Go runtime and process series
	if s3nars, ok := nars.(*s3store.Store); ok {
		registry.MustRegister(s3nars.Collectors()...)
	}
	schedCfg := jobLoopConfig(opts, log, registry)
	schedCfg.InstanceID = inst.ID()
	var keys *deploykeys.Keys // without a dial key projects have no deploy keys
	if dialKey != nil {
		keys = deploykeys.New(db, dialKey) // the job loop's and the server's
		schedCfg.DeployKeys = keys
	}
	sched := scheduler.New(db, schedCfg)
	if err := sched.Start(ctx); err != nil {
		return fmt.Errorf("job loop: %w", err)
	}
	defer sched.Close()
	srv := server.New(db, server.Config{
		Jobs:     sched,
		Metrics:  registry,
		NarStore: nars,
		NarPresign: cache.PresignOptions{StreamNars: opts.NarHTTP == "stream", StreamUploads: !opts.NarPresignUploads,
			MultipartThreshold: opts.MultipartThreshold, PullURLMinBytes: opts.PresignedPullMinBytes},
		HeartbeatTimeout: heartbeat,
		MaxConnections:   opts.MaxConnections,
		HandshakesPerIP:  opts.HandshakesPerIP,

		DisableAnonymousCache:       !opts.AnonymousCache,
		AnonymousCacheSessionsPerIP: opts.AnonymousCachePerIP,
		Federate:                    opts.Federate,
		DisableDialing:              !opts.Discoverable,
		AdminTokenHash:              adminHash,
		DialKey:                     dialKey,
		DeployKeys:                  keys,
		Logger:                      log,
		PollInterval:                opts.PollInterval,
		GCInterval:                  opts.GCInterval,
		GCGrace:                     opts.GCGrace,
		KeepEvaluations:             opts.KeepEvaluations,
		GCPauseFile:                 os.Getenv("GRADIENT_TEST_GC_PAUSE_FILE"), // tests' hook: pause mid-sweep
		ExternalURL:                 strings.TrimRight(opts.ExternalURL, "/"),
		Instance:                    inst,

		AllowLocalRepositories: opts.AllowLocalRepositories,

		// The flag's 0 disables the limit; Config reads 0 as its default.
		AuthFailuresPerMinute: cmp.Or(opts.AuthFailures, -1),
	})

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		srv.Close()
		return fmt.Errorf("listen on %s: %w", opts.Listen, err)
	}
	// Header, body and keep-alive timeouts (/proto sessions keep their own
	// heartbeat), and room made near the open-file limit.
	guardMetrics, err := httpguard.NewMetrics(registry, "gradient_server")
	if err != nil {
		srv.Close()
		ln.Close()
		return err
	}
	guarded := httpguard.NewListener(ln, guardMetrics, log)
	guarded.ShedUnauthenticated = srv.ShedUnauthenticated
	httpServer := httpguard.Server(srv.Handler(), opts.HTTP, log)
	httpServer.ConnState = guarded.ConnState
	served := make(chan error, 1)
	go func() { served <- httpServer.Serve(guarded) }()
	// One line with what the server runs with; never a secret (the
	// database location is logged redacted by storage.Open).
	log.Info("gradient-server listening", "address", ln.Addr().String(), "instance_id", inst.ID(),
		"database_engine", db.Engine(), "nar_store", narWhere, "nar_dir", localNarDir(opts), "dial_key", dialKey != nil, "admin_api", adminHash != "",
		"heartbeat_timeout", opts.HeartbeatTimeout.String(), "max_connections", opts.MaxConnections,
		"http_header_timeout", opts.HTTP.Header.String(), "http_body_timeout", opts.HTTP.Body.String(), "http_idle_timeout", opts.HTTP.Idle.String(),
		"max_handshakes_per_ip", opts.HandshakesPerIP, "anonymous_cache", opts.AnonymousCache,
		"anonymous_cache_per_ip", opts.AnonymousCachePerIP, "auth_failures_per_minute", opts.AuthFailures,
		"build_default_timeout_secs", opts.BuildDefaultTimeoutSecs, "build_default_max_silent_secs", opts.BuildDefaultMaxSilentSecs,
		"build_max_attempts", opts.BuildMaxAttempts, "build_retry_backoff", opts.BuildRetryBackoff.String(),
		"federate", opts.Federate, "discoverable", opts.Discoverable, "poll_interval", opts.PollInterval.String(), "allow_local_repositories", opts.AllowLocalRepositories)
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case err := <-served:
		srv.Close()
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	log.Info("stopping: closing every worker session")
	// Sessions first: Shutdown does not track hijacked WebSocket
	// connections, and closing them at once is the spec's Server Stop.
	srv.Close()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := httpServer.Shutdown(shutdownCtx); err != nil {
		log.Warn("http shutdown did not finish cleanly", "error", err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	log.Info("stopped")
	return nil
}

// narDir is where the NAR store lives: --nar-dir, else next to an
// embedded SQLite database, else ./gradient-data.
// openNarStore opens the configured NAR store and says where it is (for
// the start-up line: never the credentials). An S3 store also gets its
// sweep of abandoned uploads, running until ctx ends.
func openNarStore(ctx context.Context, opts options, log *slog.Logger) (narstore.Store, string, error) {
	if opts.NarStore == "local" || opts.NarStore == "" {
		nars, err := narstore.OpenLocal(narDir(opts), log)
		return nars, "local", err
	}
	cfg := opts.S3
	// Server-side puts and relayed uploads are staged on the data disk,
	// not in a possibly small /tmp.
	cfg.StagingDir = filepath.Join(narDir(opts), "s3-staging")
	if err := os.MkdirAll(cfg.StagingDir, 0o750); err != nil {
		return nil, "", fmt.Errorf("nar store: %w", err)
	}
	if opts.MultipartThreshold > 0 && opts.MultipartThreshold < s3store.DefaultPartSize {
		log.Warn("nar store: --nar-multipart-threshold is below the 64 MiB part size; parts stay 64 MiB")
	}
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nars, err := s3store.Open(openCtx, cfg, nil, log)
	if err != nil {
		return nil, "", err
	}
	go nars.RunSweeper(ctx, 15*time.Minute, 0)
	return nars, cfg.String(), nil
}

// localNarDir is the NAR directory of a local store, "" for S3.
func localNarDir(opts options) string {
	if opts.NarStore != "local" && opts.NarStore != "" {
		return ""
	}
	return narDir(opts)
}

func narDir(opts options) string {
	switch {
	case opts.NarDir != "":
		return opts.NarDir
	case strings.HasPrefix(opts.Database, "sqlite://"):
		target := strings.TrimPrefix(opts.Database, "sqlite://")
		if strings.HasSuffix(target, "/") {
			return target // a data directory
		}
		return filepath.Dir(target) // beside the database file
	case strings.Contains(opts.Database, "://"):
		return "./gradient-data"
	default:
		return opts.Database // a data directory
	}
}

// sealSigningKeys keeps caches' signing keys sealed under the dial key:
// keys stored in the clear by an earlier run without one are sealed now.
// Without a key, the keys stay in the clear (anyone who reads the database
// can sign paths that clients trust), and a database whose keys are
// sealed refuses to start rather than fail every narinfo later.
func sealSigningKeys(ctx context.Context, db *storage.DB, dialKey *sealbox.Box, log *slog.Logger) error {
	if dialKey == nil {
		sealed, err := db.CountSealedSigningKeys(ctx)
		if err != nil {
			return err
		}
		if sealed > 0 {
			return fmt.Errorf("the signing keys of %d caches are sealed: start the server with the --dial-key-file they were sealed with", sealed)
		}
		log.Warn("no dial key configured: caches' signing keys are stored in the clear in the database (set --dial-key-file or GRADIENT_DIAL_KEY_FILE)")
		return nil
	}
	db.SealSecretsWith(dialKey)
	sealed, err := db.SealStoredSigningKeys(ctx)
	if err != nil {
		return fmt.Errorf("seal caches' signing keys: %w", err)
	}
	if sealed > 0 {
		log.Info("sealed caches' signing keys stored in the clear", "caches", sealed)
	}
	return nil
}

// jobLoopConfig is the scheduler's configuration from the options.
func jobLoopConfig(opts options, log *slog.Logger, registry prometheus.Registerer) scheduler.Config {
	backoff := opts.BuildRetryBackoff
	if backoff == 0 {
		backoff = -1 // the scheduler's "at once"; its zero is the default
	}
	return scheduler.Config{Logger: log, Metrics: registry, MaxAttempts: opts.BuildMaxAttempts, RetryBackoff: backoff,
		DefaultTimeoutSecs: new(opts.BuildDefaultTimeoutSecs), DefaultMaxSilentSecs: new(opts.BuildDefaultMaxSilentSecs)}
}
