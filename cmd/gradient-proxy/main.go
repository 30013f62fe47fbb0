// Command gradient-proxy is the federation proxy (docs/protocol/federation.md): a
// worker to every tenant's Gradient server and an authority to its own
// pool of workers, forwarding each tenant's jobs and cache traffic
// between the tenant's server and the tenant's workers. It serves /proto
// for its workers, the admin API under /api/v1 (proxy/admin), /healthz
// and /metrics.
package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"gradient.dev/gradient/internal/gctune"
	"gradient.dev/gradient/internal/servicecli"
)

func main() {
	gctune.Apply(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	os.Exit(servicecli.ExitCode("gradient-proxy", err, os.Stderr))
}

// run parses the configuration and serves until ctx ends; separate from
// main so tests can drive it with their own environment.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	opts, err := parseOptions(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := servicecli.NewLogger(opts.LogLevel, opts.LogFormat, stderr)
	// Packages such as storage/sqldb log through the default logger.
	slog.SetDefault(log)
	return serve(ctx, opts, log, nil)
}
