package session

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

// DialOptions configure Dial. The zero value is usable.
type DialOptions struct {
	// Header is sent with the upgrade request (e.g. Authorization for a
	// private cache session: see BearerAPIKey).
	Header http.Header
	// TLS configures wss:// dials; nil uses the system roots.
	TLS *tls.Config
	// ConnectTimeout bounds TCP, TLS and the upgrade; 0 means ConnectTimeout.
	ConnectTimeout time.Duration
	// Logger receives the ws:// warning; nil uses slog.Default().
	Logger *slog.Logger
	// Control, when set, is the TCP dialer's Control: it sees every
	// address the URL's host resolved to before the connect and may
	// refuse it (internal/dialguard refuses link-local addresses).
	Control func(network, address string, c syscall.RawConn) error
}

// Dial opens a WebSocket to url (ws:// or wss://) with the protocol's socket
// settings: TCP_NODELAY, 8 MiB message cap, no compression. The result still
// has to agree on a version: wrap it with NewConn.
func Dial(ctx context.Context, url string, opts DialOptions) (Transport, error) {
	timeout := opts.ConnectTimeout
	if timeout <= 0 {
		timeout = ConnectTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if strings.HasPrefix(url, "ws://") {
		logger(opts.Logger).Warn("dialing without TLS", "url", url)
	}
	netDial := dialCoalescing
	if opts.Control != nil {
		nd := *netDialer
		nd.Control = opts.Control
		netDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialCoalescingWith(ctx, &nd, network, addr)
		}
	}
	d := &websocket.Dialer{
		NetDialContext:    netDial,
		TLSClientConfig:   opts.TLS,
		ReadBufferSize:    readBufferSize,
		WriteBufferSize:   clientWriteBufferSize,
		WriteBufferPool:   &clientWritePool,
		EnableCompression: false,
	}
	c, resp, err := d.DialContext(ctx, url, opts.Header)
	if err != nil {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			// gorilla reports the socket deadline it derived from ctx
			// as an i/o timeout; name the cause.
			err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
		}
		if resp != nil {
			return nil, fmt.Errorf("dial %s: %w (HTTP %d)", url, err, resp.StatusCode)
		}
		return nil, fmt.Errorf("dial %s: %w", url, err)
	}
	return NewWebSocketTransport(c), nil
}

// netDialer is the TCP dialer behind every Dial.
var netDialer = &net.Dialer{KeepAlive: 30 * time.Second}

// dialNoDelay opens a TCP connection with Nagle's algorithm off, so small
// control frames never wait for a delayed ACK. Go enables TCP_NODELAY by
// default; setting it here makes the guarantee independent of that
// default.
func dialNoDelay(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialNoDelayWith(ctx, netDialer, network, addr)
}

func dialNoDelayWith(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if err := setNoDelay(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// dialCoalescing is dialNoDelay with the socket wrapped so the writer's
// batches go out in one write each (coalescingConn).
func dialCoalescing(ctx context.Context, network, addr string) (net.Conn, error) {
	return dialCoalescingWith(ctx, netDialer, network, addr)
}

func dialCoalescingWith(ctx context.Context, d *net.Dialer, network, addr string) (net.Conn, error) {
	c, err := dialNoDelayWith(ctx, d, network, addr)
	if err != nil {
		return nil, err
	}
	return &coalescingConn{Conn: c}, nil
}

func setNoDelay(c net.Conn) error {
	if tc, ok := c.(*net.TCPConn); ok {
		return tc.SetNoDelay(true)
	}
	return nil
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}
