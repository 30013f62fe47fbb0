// Command gradient-server is the long-running Gradient server: workers
// connect to /proto, operators use the admin API under /api/v1 (through
// `gradient`), Prometheus scrapes /metrics.
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
	// A larger GC target unless the operator set GOGC/GOMEMLIMIT: token
	// checks allocate 19 MiB each (see internal/gctune).
	gctune.Apply(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(servicecli.ExitCode("gradient-server", err, os.Stderr))
}

// run parses the configuration and serves until ctx ends; separate from
// main so tests can drive it with their own environment.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	opts, err := parseOptions(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(opts, stderr)
	// Packages such as storage log through the default logger.
	slog.SetDefault(log)
	return serve(ctx, opts, log, nil)
}
