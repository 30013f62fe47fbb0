package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// DefaultSocket is where the system's Nix daemon listens.
const DefaultSocket = "/nix/var/nix/daemon-socket/socket"

// Dialer opens a byte stream to a daemon.
type Dialer func(ctx context.Context) (io.ReadWriteCloser, error)

// Socket dials a daemon's Unix socket.
func Socket(path string) Dialer {
	return func(ctx context.Context) (io.ReadWriteCloser, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

// Command starts a daemon per connection, such as `nix-daemon --stdio
// --store DIR`, and speaks to its standard input and output. The
// process's standard error goes to stderr (nil: discarded).
func Command(program string, args, env []string, stderr io.Writer) Dialer {
	return func(ctx context.Context) (io.ReadWriteCloser, error) {
		cmd := exec.Command(program, args...)
		cmd.Env = env
		cmd.Stderr = stderr
		// Its own process group: a terminal's Ctrl-C reaches the worker,
		// which then ends its builds itself.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return &childStream{cmd: cmd, stdin: stdin, stdout: stdout}, nil
	}
}

// childStream is a daemon child's standard input and output.
type childStream struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	once   sync.Once
}

// PID is the daemon child's process ID.
func (s *childStream) PID() int { return s.cmd.Process.Pid }

// ChildPID is the process ID of the daemon child a Command dialer
// started for rwc; false for a socket's connection.
func ChildPID(rwc io.ReadWriteCloser) (int, bool) {
	if s, ok := rwc.(*childStream); ok {
		return s.PID(), true
	}
	return 0, false
}

func (s *childStream) Read(p []byte) (int, error)  { return s.stdout.Read(p) }
func (s *childStream) Write(p []byte) (int, error) { return s.stdin.Write(p) }

// Close ends the daemon: end of input stops an idle one; an interrupt
// makes a busy one stop its builds; it is killed if it lingers.
func (s *childStream) Close() error {
	s.once.Do(func() {
		s.stdin.Close()
		s.cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	return nil
}

// Options tune a Client.
type Options struct {
	// MaxConns bounds the open connections (0: 4). An operation waits
	// for a free one.
	MaxConns int
	// MaxAge retires a connection once it is this old and idle (0: 10
	// minutes): the daemon keeps a temporary GC root for everything a
	// connection added until the connection ends.
	MaxAge time.Duration
	// BuildHook is the build-hook setting sent with every build (a
	// program); "" leaves the daemon's. The daemon starts its hook once
	// per build operation, so its default, `nix __build-remote`, costs a
	// Nix process per build even when it declines (no remote builders).
	// Settings stay with a connection, so it is the client's, not a
	// build's.
	BuildHook string
	Logger    *slog.Logger
}

// Client is a small pool of daemon connections. It is safe for
// concurrent use.
type Client struct {
	dial   Dialer
	max    int
	maxAge time.Duration
	log    *slog.Logger
	// buildHook is Options.BuildHook.
	buildHook string

	mu     sync.Mutex
	idle   []*conn
	open   int
	freed  chan struct{} // a slot became free
	closed bool
	last   Handshake
}

// New returns a client that dials with dial when it needs a connection.
func New(dial Dialer, opts Options) *Client {
	c := &Client{dial: dial, max: opts.MaxConns, maxAge: opts.MaxAge, log: opts.Logger, buildHook: opts.BuildHook, freed: make(chan struct{}, 1)}
	if c.max <= 0 {
		c.max = 4
	}
	if c.maxAge <= 0 {
		c.maxAge = 10 * time.Minute
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	return c
}

// ErrClosed is returned by operations on a closed Client.
var ErrClosed = errors.New("nix daemon: client closed")

// Close ends every idle connection; busy ones end when released.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.dropIdle()
	return nil
}

// Handshake returns what the daemon said on the newest connection
// (connecting if there is none yet).
func (c *Client) Handshake(ctx context.Context) (Handshake, error) {
	var hs Handshake
	err := c.do(ctx, true, func(cn *conn) error { hs = cn.hs; return nil })
	return hs, err
}

// get returns an idle connection or a new one, waiting for a free slot.
func (c *Client) get(ctx context.Context) (cn *conn, reused bool, err error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, false, ErrClosed
		}
		if n := len(c.idle); n > 0 {
			cn = c.idle[n-1]
			c.idle = c.idle[:n-1]
			c.mu.Unlock()
			return cn, true, nil
		}
		if c.open < c.max {
			c.open++
			c.mu.Unlock()
			cn, err = c.connect(ctx)
			if err != nil {
				c.release(nil)
				return nil, false, err
			}
			return cn, false, nil
		}
		c.mu.Unlock()
		select {
		case <-c.freed:
		case <-ctx.Done():
			return nil, false, fmt.Errorf("%w: waiting for a connection: %w", ErrConnection, ctx.Err())
		}
	}
}

func (c *Client) connect(ctx context.Context) (*conn, error) {
	start := time.Now()
	rwc, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: connecting: %w", ErrConnection, err)
	}
	cn := newConn(rwc)
	stop := context.AfterFunc(ctx, func() { rwc.Close() })
	err = cn.handshake()
	if !stop() {
		err = ctx.Err()
	}
	if err != nil {
		rwc.Close()
		return nil, fmt.Errorf("%w: handshake: %w", ErrConnection, err)
	}
	c.mu.Lock()
	c.last = cn.hs
	c.mu.Unlock()
	c.log.Debug("nix daemon: connected", "protocol", FormatVersion(cn.hs.Version), "nix", cn.hs.NixVersion, "took", time.Since(start))
	return cn, nil
}

// DropIdle closes the idle connections (and the temporary roots their
// daemons hold); the client stays usable.
func (c *Client) DropIdle() { c.dropIdle() }

// dropIdle closes the idle connections.
func (c *Client) dropIdle() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.open -= len(idle)
	c.mu.Unlock()
	for _, cn := range idle {
		cn.rwc.Close()
	}
}

// release returns a healthy connection to the pool, or frees the slot of
// a broken one (nil).
func (c *Client) release(cn *conn) {
	c.mu.Lock()
	if cn != nil && !c.closed && time.Since(cn.created) < c.maxAge {
		c.idle = append(c.idle, cn)
	} else {
		c.open--
		if cn != nil {
			defer cn.rwc.Close()
		}
	}
	c.mu.Unlock()
	select {
	case c.freed <- struct{}{}:
	default:
	}
}

// discard is an operation's error after which its connection is out of
// step, though the connection itself did not fail.
type discard struct{ error }

func (d discard) Unwrap() error { return d.error }

// do runs op on a connection it holds throughout. A daemon *Error leaves
// the connection usable; any other failure closes it and wraps
// ErrConnection. An idempotent op that fails on a reused connection
// (the daemon restarted while it sat idle) runs once more on a new one.
func (c *Client) do(ctx context.Context, idempotent bool, op func(*conn) error) error {
	for attempt := 0; ; attempt++ {
		cn, reused, err := c.get(ctx)
		if err != nil {
			return err
		}
		stop := context.AfterFunc(ctx, func() { cn.rwc.Close() })
		err = op(cn)
		interrupted := !stop()
		var (
			daemonErr *Error
			d         discard
		)
		switch {
		case interrupted:
		case err == nil:
			c.release(cn)
			return nil
		case errors.As(err, &d):
			c.release(nil)
			cn.rwc.Close()
			return d.error
		case errors.As(err, &daemonErr):
			c.release(cn)
			return err
		}
		c.release(nil)
		cn.rwc.Close()
		if interrupted {
			return fmt.Errorf("%w: %w", ErrConnection, ctx.Err())
		}
		// What ended this connection (a daemon restart, an OOM kill)
		// most likely ended the idle ones too: a later operation, which
		// may not be one to retry, must not be the one to find out.
		c.dropIdle()
		if idempotent && reused && attempt == 0 && !errors.Is(err, ErrProtocol) {
			c.log.Debug("nix daemon: connection lost; retrying on a new one", "error", err)
			continue
		}
		return fmt.Errorf("%w: %w", ErrConnection, err)
	}
}

// LocalDialer is how the worker reaches the store: the system daemon's
// socket when store is empty and the socket exists, otherwise a
// `nix-daemon --stdio` child (on store, a chroot store directory, when
// set) with env as its environment.
func LocalDialer(nixDaemon, store string, env []string, stderr io.Writer) Dialer {
	if store == "" {
		if fi, err := os.Stat(DefaultSocket); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return Socket(DefaultSocket)
		}
	}
	args := []string{"--stdio"}
	if store != "" {
		args = append(args, "--store", store)
	}
	return Command(nixDaemon, args, env, stderr)
}
