package nix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"syscall"

	"gradient.dev/gradient/nix/daemon"
)

// daemonClient is the connection pool to the store's daemon, made on
// first use: the system daemon's socket for the default store when it
// listens, otherwise `nix-daemon --stdio` children on Store with this
// Nix's configuration. Builds run with the decline hook (buildhook.go).
func (n *Nix) daemonClient() *daemon.Client {
	n.daemonOnce.Do(func() {
		n.daemon = daemon.New(n.dialer(), daemon.Options{Logger: n.logger(), BuildHook: n.buildHook()})
	})
	return n.daemon
}

func (n *Nix) dialer() daemon.Dialer {
	if n.Dialer != nil {
		return n.Dialer
	}
	return daemon.LocalDialer(n.program("nix-daemon"), n.Store, n.environ(), slogWriter{n.logger()})
}

// longOpConns bounds the connections of each pool of long operations.
// A build holds its daemon connection for as long as it runs, and a
// substitution or an import for as long as its download: they get pools
// of their own (longOpClient). In the one pool of 4, the fifth concurrent
// build waited for one of the first four to end, and everything else the
// worker did meanwhile (an evaluation reading and uploading its .drv
// files, a job's input checks) waited behind builds of any length. The
// worker's slots bound the builds; this only caps a runaway.
const longOpConns = 64

// longOpClient is the pool a long operation runs on (see longOpConns): for
// a build with a niceness (BuildOptions.Nice) one whose daemon children
// run that much nicer than this process, so the builds they fork do too.
// The system daemon's connections are not this process's children:
// builds through it keep the daemon's priority.
func (n *Nix) longOpClient(nice int) *daemon.Client {
	if nice <= 0 {
		n.longOnce.Do(func() {
			n.longDaemon.Store(daemon.New(n.dialer(), daemon.Options{Logger: n.logger(), BuildHook: n.buildHook(), MaxConns: longOpConns}))
		})
		return n.longDaemon.Load()
	}
	n.lowOnce.Do(func() {
		base := n.dialer()
		dial := func(ctx context.Context) (io.ReadWriteCloser, error) {
			rwc, err := base(ctx)
			if err != nil {
				return nil, err
			}
			if pid, ok := daemon.ChildPID(rwc); ok {
				if err := lowerPriority(pid, nice); err != nil {
					n.logger().Warn("nix: cannot lower a build daemon's CPU priority", "pid", pid, "error", err)
				}
			}
			return rwc, nil
		}
		n.lowDaemon.Store(daemon.New(dial, daemon.Options{Logger: n.logger(), BuildHook: n.buildHook(), MaxConns: longOpConns}))
	})
	return n.lowDaemon.Load()
}

// lowerPriority makes process pid nice more nice than this process
// (capped at 19, the lowest priority).
func lowerPriority(pid, nice int) error {
	// The raw getpriority system call answers 20 - nice.
	raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		return err
	}
	return syscall.Setpriority(syscall.PRIO_PROCESS, pid, min(20-raw+nice, 19))
}

// Close ends the connections to the daemon (and the daemon children).
// Operations after it fail (the pools stay closed): call it once the Nix
// is done.
func (n *Nix) Close() error {
	if n.daemon != nil {
		n.daemon.Close()
	}
	if b := n.longDaemon.Load(); b != nil {
		b.Close()
	}
	if low := n.lowDaemon.Load(); low != nil {
		low.Close()
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
