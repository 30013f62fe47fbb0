// Command gradient-worker is the Gradient build machine: it keeps a session
// with the server (dialing it, or dialed by it), authenticates for the peers
// that registered it, and runs the jobs it is assigned.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/internal/servicecli"
	"gradient.dev/gradient/metrics"
	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

func main() {
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	ctx, abort := onSignals(signals)
	err := run(ctx, abort, os.Args[1:], os.Getenv, os.Stderr)
	signal.Stop(signals)
	os.Exit(servicecli.ExitCode("gradient-worker", err, os.Stderr))
}

// onSignals is the two-stage stop (docs/protocol/jobs.md §12.3): ctx ends at the first
// signal (drain), abort closes at the second (abort the drain).
func onSignals(signals <-chan os.Signal) (ctx context.Context, abort <-chan struct{}) {
	ctx, stop := context.WithCancel(context.Background())
	aborted := make(chan struct{})
	go func() {
		<-signals
		stop()
		<-signals
		close(aborted)
	}()
	return ctx, aborted
}

// run parses the configuration and serves until ctx ends (the signal):
// the worker then drains its session within the drain timeout, or until
// abort closes, and returns.
func run(ctx context.Context, abort <-chan struct{}, args []string, getenv func(string) string, stderr io.Writer) error {
	opts, err := parseOptions(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(opts, stderr)
	slog.SetDefault(log)
	// Store operations go to the Nix daemon (its socket, or `nix-daemon
	// --stdio` children without one); evaluation runs the Nix CLI.
	nixStore := &nix.Nix{BinDir: opts.NixBin, Logger: log, TrustedKeys: opts.TrustedKeys, ImportUnsigned: !opts.RequireSigs}
	if opts.BaseDir != "" {
		// The build hook and temporary clones live in the worker's own
		// state directory, not under a fixed name in a shared /tmp.
		work := filepath.Join(opts.BaseDir, "work")
		if err := os.MkdirAll(work, 0o700); err != nil {
			return fmt.Errorf("work directory: %w", err)
		}
		nixStore.WorkDir = work
	}
	defer nixStore.Close()
	if len(opts.SystemFeatures) == 0 {
		opts.SystemFeatures = detectSystemFeatures(ctx, nixStore, log)
	}
	if len(opts.Architectures) == 0 {
		opts.Architectures = detectArchitectures(ctx, nixStore, log)
	}
	cfg, err := workerConfig(opts, log)
	if err != nil {
		return err
	}
	cfg.AbortDrain = abort
	executor := &nixexec.Executor{Nix: nixStore, Cores: opts.BuildCores, SSH: opts.SSHBin, Logger: log,
		EvalShards: opts.EvalShards, EvalMaxMemoryMiB: opts.EvalMaxMemoryMiB, EvalBuildNice: opts.EvalBuildNice,
		GCRootsDir: gcRootsDir(opts.GCRootsDir, log), AllowLocalRepositories: opts.AllowLocalRepositories,
		LogBurstPerMinute: unlimitedIfZero(opts.LogBurstPerMin), LogSustainedPerHour: unlimitedIfZero(opts.LogSustainedPerHour)}
	if err := executor.ResetGCRoots(); err != nil {
		log.Warn("cannot clear GC roots left by an earlier run", "dir", executor.GCRootsDir, "error", err)
	}
	cfg.Executor = executor
	registry := metrics.NewRegistry() // with the Go runtime and process series
	cfg.Session.Metrics = registry
	if executor.GC, err = storeGC(ctx, opts, nixStore, executor.GCRootsDir, registry, log); err != nil {
		return err
	}
	if executor.GC != nil {
		gcCtx, stopGC := context.WithCancel(context.Background())
		defer stopGC()
		go executor.GC.Run(gcCtx)
	}
	logStart(log, opts, cfg)
	w, err := worker.New(cfg)
	if err != nil {
		return err
	}
	if opts.MetricsAddr != "" {
		stop, err := serveMetrics(opts.MetricsAddr, registry, opts.HTTP, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return w.Run(ctx)
}

// logStart is the one line saying what the worker runs with: paths of
// files with secrets, never their contents or inline tokens.
func logStart(log *slog.Logger, opts options, cfg worker.Config) {
	attrs := []any{"server_url", gitsource.Redact(opts.ServerURL), "worker_id", cfg.Session.WorkerID,
		slog.Group("capabilities", "fetch", opts.Fetch, "eval", opts.Eval, "build", opts.Build, "federate", opts.Federate), "build_slots", opts.MaxBuilds, "eval_slots", opts.MaxEvals, "drain_timeout", opts.DrainTimeout.String(),
		"architectures", opts.Architectures, "system_features", opts.SystemFeatures,
		"peers_file", opts.PeersFile, "inline_peers", opts.Peers != "", "accepted_server_tokens_file", opts.AcceptedTokenFile,
		"discoverable", opts.Discoverable}
	if opts.Discoverable {
		attrs = append(attrs, "listen", opts.ListenAddr, "tls", !opts.InsecureListen)
	}
	attrs = append(attrs, "metrics_addr", opts.MetricsAddr, "gcroots_dir", opts.GCRootsDir,
		"log_burst_bytes_per_min", opts.LogBurstPerMin, "log_sustained_bytes_per_hour", opts.LogSustainedPerHour,
		"allow_local_repositories", opts.AllowLocalRepositories, "gc_min_free", opts.GCMinFree, "gc_max_free", opts.GCMaxFree,
		"trusted_public_keys", opts.TrustedKeys.Names(), "require_sigs", opts.RequireSigs)
	log.Info("gradient-worker starting", attrs...)
	switch {
	case !opts.RequireSigs:
		log.Warn("--require-sigs=false: every server this worker serves can put any input-addressed path into its Nix store; use it only for a store no one else uses")
	case opts.TrustedKeys.Len() == 0:
		log.Warn("no --trusted-public-keys: pulled input-addressed paths (other workers' build outputs) are refused unless Nix's own trusted-public-keys signed them; pass the keys of the caches this worker pulls from")
	}
}

// serveMetrics serves the worker's series at http://addr/metrics until
// stop is called.
func serveMetrics(addr string, reg prometheus.Gatherer, timeouts httpguard.Timeouts, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httpguard.Server(mux, timeouts, log)
	go srv.Serve(ln)
	log.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return func() { srv.Close() }, nil
}

// detectSystemFeatures reads the system features the local Nix is
// configured with (docs/protocol/worker.md: the default when --system-features is not
// given). Without a working Nix the worker advertises none, and says why.
func detectSystemFeatures(ctx context.Context, n *nix.Nix, log *slog.Logger) []string {
	features, err := n.SystemFeatures(ctx)
	if err != nil {
		log.Warn("cannot read system features from nix; advertising none (set --system-features)", "error", err)
		return nil
	}
	return features
}

// gcRootsDir is dir if the worker can create links there, else "" (and
// says why once): a worker without the rights still runs jobs, unpinned.
func gcRootsDir(dir string, log *slog.Logger) string {
	if dir == "" {
		return ""
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Warn("GC roots disabled: cannot use --gcroots-dir (a garbage collection may delete paths a job still needs)", "dir", dir, "error", err)
		return ""
	}
	return dir
}

// unlimitedIfZero maps the flags' "0 is unlimited" to the executor's
// negative.
func unlimitedIfZero(v int64) int64 {
	if v == 0 {
		return -1
	}
	return v
}

// detectArchitectures reads the systems the local Nix builds for (its
// system and extra-platforms); without a working Nix the host system.
func detectArchitectures(ctx context.Context, n *nix.Nix, log *slog.Logger) []string {
	system, extra, err := n.System(ctx)
	if err != nil {
		log.Warn("cannot read the system from nix; advertising the host system (set --system-architectures)", "error", err)
		return nil
	}
	return append([]string{system}, extra...)
}

// workerConfig turns options into the worker's configuration: the worker
// ID (created on first start) and the accepted server tokens are read here.
func workerConfig(opts options, log *slog.Logger) (worker.Config, error) {
	id, err := worker.LoadID(opts.BaseDir, opts.ID)
	if err != nil {
		return worker.Config{}, err
	}
	cfg := worker.Config{
		Session: workersession.Config{
			ServerURL: opts.ServerURL, WorkerID: id,
			PeersFile: opts.PeersFile, Peers: opts.Peers,
			Capabilities:   wire.GradientCapabilities{Fetch: opts.Fetch, Eval: opts.Eval, Build: opts.Build, Federate: opts.Federate},
			ListenTimeouts: opts.HTTP,
			ListenAddr:     opts.ListenAddr, TLSCertFile: opts.TLSCertFile, TLSKeyFile: opts.TLSKeyFile,
			InsecureListen: opts.InsecureListen,
			Logger:         log,
		},
		MaxBuilds: opts.MaxBuilds, MaxEvals: opts.MaxEvals, DrainTimeout: opts.DrainTimeout,
		Architectures: opts.Architectures, SystemFeatures: opts.SystemFeatures,
		CPUCoreScore: opts.CPUCoreScore, Zone: opts.Zone, Endpoint: opts.Endpoint,
	}
	if opts.AcceptedTokenFile != "" {
		cfg.Session.ServerTokens = worker.LoadServerTokens(opts.AcceptedTokenFile, id, log)
	}
	return cfg, nil
}
