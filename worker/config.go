package worker

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
	"gradient.dev/gradient/workersession"
)

// Config is a worker's configuration. Zero durations take the defaults of
// docs/protocol/connection.md and docs/protocol/jobs.md §12; tests shorten them.
type Config struct {
	// ServerURL is the ws(s):// /proto URL to dial; empty for a worker that
	// is only dialed by servers.
	ServerURL string
	// WorkerID is the persistent ID (see LoadID).
	WorkerID string

	// PeersFile, when set, holds the tokens and is watched for changes;
	// it wins over Peers, the inline list (same format).
	PeersFile         string
	Peers             string
	PeersPollInterval time.Duration // 2 s

	// Capabilities offered; core and cache are never a worker's.
	Capabilities   wire.GradientCapabilities
	MaxBuilds      int // Build slots (1)
	MaxEvals       int // Flake slots (1)
	Architectures  []string
	SystemFeatures []string
	CPUCoreScore   uint32 // 0: measured at start
	Zone, Endpoint string
	// OnEstablished and OnRejected are the session shell's
	// (workersession.Config).
	OnEstablished func()
	OnRejected    func(code uint16, reason string) (stopDialing bool)

	// Executor runs accepted jobs. Nil declines every assignment.
	Executor Executor
	// TempDir holds large compressed uploads while they are spooled
	// ("" means os.TempDir()); pulls stream without files.
	TempDir string

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
	Heartbeat        time.Duration // 10 s: WorkerMetrics and RequestJob
	BackoffInitial   time.Duration // 1 s
	BackoffMax       time.Duration // 60 s
	StopReportWait   time.Duration // 5 s for the Canceled reports on stop
	FlushTimeout     time.Duration // 10 s for queued messages at close
	// DrainTimeout is the stop's budget (docs/protocol/jobs.md §12.3, the two-stage
	// stop): when Run's ctx ends, each session sends Draining, takes no
	// more jobs and lets its running ones finish and report for up to
	// this long; what still runs then is aborted and reported Canceled.
	// 0 aborts at once (the v33 stop).
	DrainTimeout time.Duration
	// AbortDrain, when closed, ends a drain under way at once (the
	// second signal): the running jobs are aborted as after DrainTimeout.
	AbortDrain <-chan struct{}

	Logger *slog.Logger
	// Metrics receives the worker's series; nil keeps them in a private
	// registry. Workers sharing one need a label each
	// (prometheus.WrapRegistererWith).
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
	def(&c.StopReportWait, 5*time.Second)
	def(&c.FlushTimeout, 10*time.Second)
	if c.AckTimeout < 0 {
		c.AckTimeout = 0
	}
	if c.MaxBuilds == 0 {
		c.MaxBuilds = 1
	}
	if c.MaxEvals == 0 {
		c.MaxEvals = 1
	}
	if len(c.Architectures) == 0 {
		c.Architectures = []string{HostSystem()}
	}
	if c.SystemFeatures == nil {
		c.SystemFeatures = []string{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Capabilities.Core, c.Capabilities.Cache = false, false
}

// Session is the configuration of the worker's session shell: the
// connection half of c.
func (c *Config) Session() workersession.Config {
	return workersession.Config{
		ServerURL: c.ServerURL, WorkerID: c.WorkerID,
		PeersFile: c.PeersFile, Peers: c.Peers, PeersPollInterval: c.PeersPollInterval,
		Capabilities:  c.Capabilities,
		OnEstablished: c.OnEstablished, OnRejected: c.OnRejected,
		ListenAddr: c.ListenAddr, Listener: c.Listener, TLSCertFile: c.TLSCertFile, TLSKeyFile: c.TLSKeyFile,
		InsecureListen: c.InsecureListen, ServerTokens: c.ServerTokens, ListenTimeouts: c.ListenTimeouts,
		DialTLS: c.DialTLS, DialControl: c.DialControl,
		ConnectTimeout: c.ConnectTimeout, HandshakeTimeout: c.HandshakeTimeout, AckTimeout: c.AckTimeout,
		PingInterval: c.PingInterval, Heartbeat: c.Heartbeat, BackoffInitial: c.BackoffInitial, BackoffMax: c.BackoffMax,
		FlushTimeout: c.FlushTimeout, Logger: c.Logger, Metrics: c.Metrics,
	}
}
