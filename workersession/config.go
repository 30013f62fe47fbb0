package workersession

import (
	"crypto/tls"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// Config is the session side of a worker. Zero durations take the
// defaults of docs/protocol/connection.md and docs/protocol/jobs.md §12;
// tests shorten them.
type Config struct {
	// ServerURL is the ws(s):// /proto URL to dial; empty for a worker that
	// is only dialed by servers.
	ServerURL string
	// WorkerID is the persistent ID.
	WorkerID string

	// PeersFile, when set, holds the tokens and is watched for changes;
	// it wins over Peers, the inline list (same format).
	PeersFile         string
	Peers             string
	PeersPollInterval time.Duration // 2 s

	// Capabilities offered in the handshake; core and cache are never a
	// worker's.
	Capabilities wire.GradientCapabilities

	// OnEstablished, when set, is called after each session's handshake.
	OnEstablished func()
	// OnRejected, when set, is called when the server rejects the session
	// (in the handshake or later) with its code and reason; returning
	// true stops dialing for the rest of Run. Without it, or when it
	// returns false, the shell backs off and dials again.
	OnRejected func(code uint16, reason string) (stopDialing bool)

	// Server-dialed mode: ListenAddr serves the dialed handshake, over TLS
	// with TLSCertFile/TLSKeyFile unless InsecureListen. ServerTokens
	// checks the dialing server; nil accepts every server.
	ListenAddr              string
	Listener                net.Listener // instead of ListenAddr (tests)
	TLSCertFile, TLSKeyFile string
	InsecureListen          bool
	ServerTokens            session.ServerVerifier
	// ListenTimeouts bound what a client may hold of the listener:
	// half-sent headers, stalled bodies, idle keep-alive connections.
	ListenTimeouts httpguard.Timeouts

	DialTLS *tls.Config
	// DialControl, when set, may refuse each address the server URL
	// resolves to (net.Dialer.Control; the proxy refuses link-local
	// addresses with internal/dialguard).
	DialControl      func(network, address string, c syscall.RawConn) error
	ConnectTimeout   time.Duration // 10 s
	HandshakeTimeout time.Duration // 15 s
	AckTimeout       time.Duration // 120 s; negative disables
	PingInterval     time.Duration // AckTimeout/4
	Heartbeat        time.Duration // 10 s: WorkerMetrics and the handler's Tick
	BackoffInitial   time.Duration // 1 s
	BackoffMax       time.Duration // 60 s
	FlushTimeout     time.Duration // 10 s for queued messages at close

	Logger *slog.Logger
	// Metrics receives the session series (gradient_worker_sessions_total,
	// _connect_failures_total, _connected); nil keeps them in a private
	// registry.
	Metrics prometheus.Registerer
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.PeersPollInterval, 2*time.Second)
	def(&c.ConnectTimeout, session.ConnectTimeout)
	def(&c.HandshakeTimeout, session.HandshakeTimeout)
	def(&c.AckTimeout, session.AckTimeout)
	def(&c.Heartbeat, 10*time.Second)
	def(&c.BackoffInitial, time.Second)
	def(&c.BackoffMax, 60*time.Second)
	def(&c.FlushTimeout, 10*time.Second)
	if c.AckTimeout < 0 {
		c.AckTimeout = 0
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Capabilities.Core, c.Capabilities.Cache = false, false
}
