package workersession

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/wire"
)

// Shell is the worker's end of its sessions, as authority is the
// server's: it dials the server (or is dialed), keeps one session alive
// with reconnects and hands each session's job side to its Handler.
type Shell struct {
	cfg Config
	h   Handler
	log *slog.Logger
	m   *shellMetrics

	mu     sync.Mutex
	tokens map[string]string
	live   map[*Session]struct{}
	// sessions tracks every session goroutine, so Run returns only after
	// each finished its stop sequence; closing refuses new ones once Run
	// waits for them.
	sessions sync.WaitGroup
	closing  bool
}

// New checks the configuration and reads the peers.
func New(cfg Config, h Handler) (*Shell, error) {
	cfg.setDefaults()
	if !ValidUUID(cfg.WorkerID) {
		return nil, fmt.Errorf("worker id %q is not a UUID", cfg.WorkerID)
	}
	if cfg.ServerURL == "" && cfg.ListenAddr == "" && cfg.Listener == nil {
		return nil, errors.New("nothing to do: set a server URL or a listen address")
	}
	if (cfg.ListenAddr != "" || cfg.Listener != nil) && !cfg.InsecureListen && (cfg.TLSCertFile == "" || cfg.TLSKeyFile == "") {
		return nil, errors.New("the listener needs a TLS certificate and key (or an explicit insecure listen)")
	}
	if h == nil {
		return nil, errors.New("a session handler is required")
	}
	sh := &Shell{cfg: cfg, h: h, log: cfg.Logger.With("worker", cfg.WorkerID), live: map[*Session]struct{}{}}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	var err error
	if sh.m, err = newShellMetrics(cfg.Metrics, sh); err != nil {
		return nil, err
	}
	sh.tokens = LoadPeers(cfg.PeersFile, cfg.Peers, sh.log)
	return sh, nil
}

// ID is the worker's ID.
func (sh *Shell) ID() string { return sh.cfg.WorkerID }

// Capabilities are what the shell offers in each handshake (Config's,
// without core and cache).
func (sh *Shell) Capabilities() wire.GradientCapabilities { return sh.cfg.Capabilities }

// Logger is the shell's logger, with the worker's ID.
func (sh *Shell) Logger() *slog.Logger { return sh.log }

// Peers is how many peers' tokens the shell holds now.
func (sh *Shell) Peers() int { return len(sh.currentTokens()) }

// Connected reports whether a session with a server is established now
// (the proxy's admin API shows it for each upstream session).
func (sh *Shell) Connected() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return len(sh.live) > 0
}

// Run serves until ctx ends: dials the server URL with reconnects, serves
// the listener for server-dialed sessions, and watches the peers file.
// On ctx's end every session is stopped (Draining, the handler's Stop,
// close) before Run returns. Only local errors (a listener that cannot
// start) end it early.
func (sh *Shell) Run(ctx context.Context) error {
	defer sh.waitSessions()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if sh.cfg.PeersFile != "" {
		go watchPeersFile(runCtx, sh.cfg.PeersFile, sh.cfg.PeersPollInterval, sh.log, sh.peersChanged)
	}
	listenErr := make(chan error, 1)
	if sh.cfg.ListenAddr != "" || sh.cfg.Listener != nil {
		ln := sh.cfg.Listener
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", sh.cfg.ListenAddr); err != nil {
				return fmt.Errorf("listen for servers: %w", err)
			}
		}
		srv := httpguard.Server(sh.DialedHandler(runCtx), sh.cfg.ListenTimeouts, sh.log)
		go func() { listenErr <- sh.serveListener(srv, ln) }()
		defer srv.Close()
	}
	if sh.cfg.ServerURL != "" {
		if sh.trackSession() {
			go func() {
				defer sh.sessions.Done()
				sh.dialLoop(runCtx)
			}()
		}
	}
	select {
	case <-ctx.Done():
		sh.log.Info("worker stopping")
		return nil
	case err := <-listenErr:
		return err
	}
}

func (sh *Shell) serveListener(srv *http.Server, ln net.Listener) error {
	sh.log.Info("listening for servers", "addr", ln.Addr().String(), "tls", !sh.cfg.InsecureListen)
	var err error
	if sh.cfg.InsecureListen {
		err = srv.Serve(ln)
	} else {
		err = srv.ServeTLS(ln, sh.cfg.TLSCertFile, sh.cfg.TLSKeyFile)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("listener: %w", err)
}

// trackSession counts a session goroutine unless Run is already waiting
// for the last ones.
func (sh *Shell) trackSession() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closing {
		return false
	}
	sh.sessions.Add(1)
	return true
}

func (sh *Shell) waitSessions() {
	sh.mu.Lock()
	sh.closing = true
	sh.mu.Unlock()
	sh.sessions.Wait()
}

func (sh *Shell) currentTokens() map[string]string {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.tokens
}

// SetPeers replaces the tokens (peer ID → token) the shell holds, as a
// changed peers file does: every live session is asked for a reauth with
// them, and the next dial presents them. For tokens kept elsewhere than
// a file (a federation proxy's sealed link tokens).
func (sh *Shell) SetPeers(tokens map[string]string) { sh.peersChanged(maps.Clone(tokens)) }

// HostChanged re-sends WorkerCapabilities (on every live session that
// may build) and WorkerMetrics, after what the handler's Host and Load
// return changed.
func (sh *Shell) HostChanged() {
	for _, s := range sh.liveSessions() {
		s.sendHost()
	}
}

func (sh *Shell) liveSessions() []*Session {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	live := make([]*Session, 0, len(sh.live))
	for s := range sh.live {
		live = append(live, s)
	}
	return live
}

// peersChanged takes a new peers file and asks every live session for a
// reauth with it.
func (sh *Shell) peersChanged(tokens map[string]string) {
	sh.mu.Lock()
	if samePeers(tokens, sh.tokens) {
		sh.mu.Unlock()
		return
	}
	sh.tokens = tokens
	live := make([]*Session, 0, len(sh.live))
	for s := range sh.live {
		live = append(live, s)
	}
	sh.mu.Unlock()
	sh.log.Info("peers changed: requesting reauth", "peers", peerIDs(tokens), "sessions", len(live))
	for _, s := range live {
		if err := s.auth.RequestReauth(s.sess, tokens); err != nil {
			s.log.Warn("reauth request failed", "error", err)
		}
	}
}

func (sh *Shell) addLive(s *Session) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.live[s] = struct{}{}
}

func (sh *Shell) removeLive(s *Session) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.live, s)
}

// ServerLabel is the server URL without its credentials, for logs.
func (sh *Shell) ServerLabel() string { return gitsource.Redact(sh.cfg.ServerURL) }

// ValidUUID reports whether s is a UUID in its canonical 8-4-4-4-12 form.
func ValidUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
