package worker

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

// Worker is the build machine's side of the protocol: it dials the server
// (or is dialed), keeps one session alive with reconnects, and runs the
// jobs it is assigned through its Executor.
type Worker struct {
	cfg   Config
	log   *slog.Logger
	slots *slots
	m     *workerMetrics
	cpu   cpuSampler
	hw    wire.WorkerCapabilities

	mu     sync.Mutex
	tokens map[string]string
	live   map[*liveSession]struct{}
	// sessions tracks every session goroutine, so Run returns only after
	// each finished its stop sequence; closing refuses new ones once Run
	// waits for them.
	sessions sync.WaitGroup
	closing  bool
}

// New checks the configuration and reads the peers.
func New(cfg Config) (*Worker, error) {
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
	if cfg.MaxBuilds < 0 || cfg.MaxEvals < 0 {
		return nil, errors.New("max concurrent builds and evals may not be negative")
	}
	w := &Worker{
		cfg:   cfg,
		log:   cfg.Logger.With("worker", cfg.WorkerID),
		slots: newSlots(cfg.MaxEvals, cfg.MaxBuilds),
		live:  map[*liveSession]struct{}{},
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	var err error
	if w.m, err = newWorkerMetrics(cfg.Metrics, w); err != nil {
		return nil, err
	}
	w.tokens = LoadPeers(cfg.PeersFile, cfg.Peers, w.log)
	if cfg.HostCapabilities == nil {
		w.hw = w.hostCapabilities() // measures the core score: only when reported
	}
	w.cpu.usagePct() // the first sample is the baseline of the first heartbeat
	return w, nil
}

// ID is the worker's ID.
func (w *Worker) ID() string { return w.cfg.WorkerID }

// Connected reports whether a session with a server is established now
// (the proxy's admin API shows it for each upstream session).
func (w *Worker) Connected() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.live) > 0
}

// Run serves until ctx ends: dials the server URL with reconnects, serves
// the listener for server-dialed sessions, and watches the peers file.
// On ctx's end every session is stopped (Draining, running jobs reported
// Canceled) before Run returns. Only local errors (a listener that cannot
// start) end it early.
func (w *Worker) Run(ctx context.Context) error {
	w.log.Info("worker starting", "server", gitsource.Redact(w.cfg.ServerURL), "peers", len(w.currentTokens()),
		"capabilities", w.cfg.Capabilities.Names(), "architectures", w.capabilities().Architectures)
	defer w.waitSessions()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if w.cfg.PeersFile != "" {
		go watchPeersFile(runCtx, w.cfg.PeersFile, w.cfg.PeersPollInterval, w.log, w.peersChanged)
	}
	listenErr := make(chan error, 1)
	if w.cfg.ListenAddr != "" || w.cfg.Listener != nil {
		ln := w.cfg.Listener
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", w.cfg.ListenAddr); err != nil {
				return fmt.Errorf("listen for servers: %w", err)
			}
		}
		srv := httpguard.Server(w.DialedHandler(runCtx), w.cfg.ListenTimeouts, w.log)
		go func() { listenErr <- w.serveListener(srv, ln) }()
		defer srv.Close()
	}
	if w.cfg.ServerURL != "" {
		if w.trackSession() {
			go func() {
				defer w.sessions.Done()
				w.dialLoop(runCtx)
			}()
		}
	}
	select {
	case <-ctx.Done():
		w.log.Info("worker stopping")
		return nil
	case err := <-listenErr:
		return err
	}
}

func (w *Worker) serveListener(srv *http.Server, ln net.Listener) error {
	w.log.Info("listening for servers", "addr", ln.Addr().String(), "tls", !w.cfg.InsecureListen)
	var err error
	if w.cfg.InsecureListen {
		err = srv.Serve(ln)
	} else {
		err = srv.ServeTLS(ln, w.cfg.TLSCertFile, w.cfg.TLSKeyFile)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("listener: %w", err)
}

// trackSession counts a session goroutine unless Run is already waiting
// for the last ones.
func (w *Worker) trackSession() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closing {
		return false
	}
	w.sessions.Add(1)
	return true
}

func (w *Worker) waitSessions() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	w.sessions.Wait()
}

func (w *Worker) currentTokens() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tokens
}

// SetPeers replaces the tokens (peer ID → token) the worker holds, as a
// changed peers file does: every live session is asked for a reauth with
// them, and the next dial presents them. For tokens kept elsewhere than
// a file (a federation proxy's sealed link tokens).
func (w *Worker) SetPeers(tokens map[string]string) { w.peersChanged(maps.Clone(tokens)) }

// HostChanged re-sends WorkerCapabilities and WorkerMetrics on every live
// session that may build, after what Config.HostCapabilities and
// HostMetrics return changed.
func (w *Worker) HostChanged() {
	w.mu.Lock()
	live := make([]*liveSession, 0, len(w.live))
	for ls := range w.live {
		live = append(live, ls)
	}
	w.mu.Unlock()
	for _, ls := range live {
		ls.sendHost()
	}
}

// peersChanged takes a new peers file and asks every live session for a
// reauth with it.
func (w *Worker) peersChanged(tokens map[string]string) {
	w.mu.Lock()
	if samePeers(tokens, w.tokens) {
		w.mu.Unlock()
		return
	}
	w.tokens = tokens
	live := make([]*liveSession, 0, len(w.live))
	for ls := range w.live {
		live = append(live, ls)
	}
	w.mu.Unlock()
	w.log.Info("peers changed: requesting reauth", "peers", peerIDs(tokens), "sessions", len(live))
	for _, ls := range live {
		if err := ls.auth.RequestReauth(ls.sess, tokens); err != nil {
			ls.log.Warn("reauth request failed", "error", err)
		}
	}
}

func (w *Worker) addLive(ls *liveSession) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.live[ls] = struct{}{}
}

func (w *Worker) removeLive(ls *liveSession) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.live, ls)
}

// capabilityNames is session_loop.go's name for GradientCapabilities.Names.
func capabilityNames(c wire.GradientCapabilities) []string { return c.Names() }
