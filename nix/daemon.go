package nix

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"gradient.dev/gradient/nix/daemon"
)

// daemonClient is the connection pool to the store's daemon, made on
// first use: the system daemon's socket for the default store when it
// listens, otherwise `nix-daemon --stdio` children on Store with this
// Nix's configuration. Builds run with the decline hook (buildhook.go).
func (n *Nix) daemonClient() *daemon.Client {
	n.daemonOnce.Do(func() {
		dial := n.Dialer
		if dial == nil {
			dial = daemon.LocalDialer(n.program("nix-daemon"), n.Store, n.environ(), slogWriter{n.logger()})
		}
		n.daemon = daemon.New(dial, daemon.Options{Logger: n.logger(), BuildHook: n.buildHook()})
	})
	return n.daemon
}

// Close ends the connections to the daemon (and the daemon children).
// The Nix stays usable: a later call connects again.
func (n *Nix) Close() error {
	if n.daemon != nil {
		n.daemon.Close()
	}
	return nil
}

// DaemonHandshake connects to the daemon if needed and returns what it
// said about itself.
func (n *Nix) DaemonHandshake(ctx context.Context) (daemon.Handshake, error) {
	hs, err := n.daemonClient().Handshake(ctx)
	return hs, daemonError(ctx, err)
}

// daemonError turns a daemon failure into the errors callers of the
// CLI path got: ErrCanceled when ctx ended, TransientError when the
// daemon went away; daemon messages as they are.
func daemonError(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%w: %w", ErrCanceled, err)
	case errors.Is(err, daemon.ErrConnection) || errors.Is(err, daemon.ErrClosed):
		return &TransientError{Message: err.Error()}
	}
	var de *daemon.Error
	if errors.As(err, &de) && containsAny(strings.ToLower(de.Message), transientPatterns) {
		return &TransientError{Message: de.Error()}
	}
	return fmt.Errorf("nix daemon: %w", err)
}

// slogWriter logs a daemon child's standard error line by line.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line != "" {
			w.log.Warn("nix-daemon: " + line)
		}
	}
	return len(p), nil
}
