package session

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
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
}

// BearerAPIKey is the Authorization header value for a private cache
// session: "Bearer GRAD<key>".
func BearerAPIKey(key string) string { return "Bearer GRAD" + key }

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
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient:      noDelayClient(opts.TLS),
		HTTPHeader:      opts.Header,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("dial %s: %w (HTTP %d)", url, err, resp.StatusCode)
		}
		return nil, fmt.Errorf("dial %s: %w", url, err)
	}
	return NewWebSocketTransport(c), nil
}

// noDelayClient is an HTTP client whose every socket has Nagle's algorithm
// off, so small control frames never wait for a delayed ACK. Go enables
// TCP_NODELAY by default; setting it here makes the guarantee independent
// of that default.
func noDelayClient(tlsConfig *tls.Config) *http.Client {
	dialer := &net.Dialer{KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if err := setNoDelay(c); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		},
		TLSClientConfig:   tlsConfig,
		ForceAttemptHTTP2: false,
	}}
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
