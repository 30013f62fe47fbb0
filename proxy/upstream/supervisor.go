// Package upstream is the proxy's upstream leg (docs/protocol/federation.md): one
// ordinary worker session per tenant to the tenant's Gradient server,
// while the tenant's link is enabled, the tenant may run and the link is
// not failing. Each session runs in a workersession.Shell, so the
// handshake, reauth, heartbeat and reconnect backoff are exactly a
// worker's; the proxy supplies the tokens (the link's sealed peer
// tokens), the fixed capabilities and the hardware (Aggregate over the
// tenant's pool).
//
// A 401 or 403 Reject from the tenant's server marks the link failing
// with the server's reason and ends that tenant's dialing until the
// operator sets the link again; any other failure reconnects with the
// shell's backoff. With Config.Hubs each session's handler is the
// tenant's hub: the server's offers, jobs and cache answers go to the
// tenant's workers behind the proxy; without hubs the sessions poll for
// nothing and every AssignJob is declined.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

// DefaultCapabilities is GRADIENT_PROXY_UPSTREAM_CAPABILITIES' default.
var DefaultCapabilities = wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}

// Config configures the upstream leg.
type Config struct {
	Store *proxystore.Store
	// Capabilities is the fixed set every upstream session offers.
	Capabilities wire.GradientCapabilities
	// Pool is the downstream workers whose aggregate each tenant's
	// session reports; nil means empty pools.
	Pool Pool
	// Hubs, when set, take each tenant's session's job side (the
	// tenant's hub is its session handler).
	Hubs *hub.Set
	// Bootable, when set, names the Nix systems the tenant's Hetzner
	// workers can boot (proxy/hetzner's Reconciler.Bootable): they join
	// the reported architectures, so the tenant's server offers those
	// builds before any VM runs and the demand can boot the first one.
	// Call PoolChanged when they change.
	Bootable func(tenantID string) []string
	// PollInterval is how often the links are read again (5 s); Changed
	// reads them at once.
	PollInterval time.Duration
	// Session is the template of every tenant's session shell:
	// timeouts, backoff, heartbeat, TLS, dial control. The supervisor
	// sets the server URL, worker ID, tokens, capabilities, hooks,
	// metrics and logger; the handler is the tenant's hub.
	Session workersession.Config
	Logger  *slog.Logger
}

// Supervisor starts and stops the tenants' upstream sessions as their
// links change. It is a prometheus.Gatherer of the sessions' series,
// each labelled tenant=<ID>.
type Supervisor struct {
	cfg     Config
	log     *slog.Logger
	changed chan struct{}

	mu       sync.Mutex
	sessions map[string]*tenantSession // by tenant ID
	// refused remembers, per tenant, the link a Reject ended, in case
	// marking it failing in the store did not succeed.
	refused map[string]time.Time
}

// tenantSession is one tenant's running session shell and the link it
// runs.
type tenantSession struct {
	tenantID, tenant string
	url, workerID    string
	tokens           map[string]string
	since            time.Time // the link's StateSince: SetLink changes it
	connectedAt      time.Time // the last session's establishment (under Supervisor.mu)
	shell            *workersession.Shell
	registry         *prometheus.Registry
	cancel           context.CancelFunc
	done             chan struct{}
}

// New checks the configuration.
func New(cfg Config) (*Supervisor, error) {
	if cfg.Store == nil {
		return nil, errors.New("upstream: a store is required")
	}
	if cfg.Capabilities.Core || cfg.Capabilities.Cache {
		return nil, errors.New("upstream: core and cache are a server's capabilities, not a worker's")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Supervisor{cfg: cfg, log: cfg.Logger, changed: make(chan struct{}, 1),
		sessions: map[string]*tenantSession{}, refused: map[string]time.Time{}}, nil
}

// Run keeps the sessions in line with the links until ctx ends, then
// stops every session (Draining, close) before it returns.
func (s *Supervisor) Run(ctx context.Context) error {
	defer s.stopAll()
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		s.reconcile(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.changed:
		}
	}
}

// Changed makes Run read the links at once (after an admin change).
func (s *Supervisor) Changed() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// PoolChanged re-sends the tenant's aggregate on its live session, after
// a downstream worker joined, left, drained or sent new capabilities.
func (s *Supervisor) PoolChanged(tenantID string) {
	s.mu.Lock()
	ts := s.sessions[tenantID]
	s.mu.Unlock()
	if ts != nil {
		ts.shell.HostChanged()
	}
}

// Hardware is what the tenant's session reports now: the aggregate of
// its pool, its architectures joined by the systems its Hetzner workers
// can boot (Config.Bootable). Slots, CPUs and RAM stay the connected
// workers' own: the scheduler offers and assigns builds by architecture
// and features, and the hub declines an assignment until a capable
// worker waits.
func (s *Supervisor) Hardware(tenantID string) Hardware {
	var h Hardware
	if s.cfg.Pool == nil {
		h = Aggregate(nil)
	} else {
		h = Aggregate(s.cfg.Pool.Members(tenantID))
	}
	if s.cfg.Bootable != nil {
		h.Host.Architectures = union(h.Host.Architectures, s.cfg.Bootable(tenantID))
	}
	return h
}

// reconcile starts the sessions of links that should connect and stops
// the others; a link with a new URL, worker ID or a changed or removed
// token gets a new session, added peers alone reauth the live one.
func (s *Supervisor) reconcile(ctx context.Context) {
	links, err := s.cfg.Store.Links(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("cannot read the upstream links; keeping the sessions as they are", "error", err)
		}
		return
	}
	want := map[string]proxystore.Link{}
	s.mu.Lock()
	for _, l := range links {
		// Marking the link failing, or setting it again, changes its
		// StateSince: the store then speaks for the link again.
		if refusedSince, ok := s.refused[l.TenantID]; ok && !refusedSince.Equal(l.StateSince) {
			delete(s.refused, l.TenantID)
		}
		if _, refused := s.refused[l.TenantID]; l.Connects() && !refused {
			want[l.TenantID] = l
		}
	}
	var stale []*tenantSession
	for id, ts := range s.sessions {
		if l, ok := want[id]; !ok || l.URL != ts.url || l.WorkerID != ts.workerID {
			stale = append(stale, ts)
			delete(s.sessions, id)
		}
	}
	s.mu.Unlock()
	for _, ts := range stale {
		s.stop(ts)
	}
	for id, l := range want {
		tokens, err := s.tokens(ctx, l)
		if err != nil {
			continue
		}
		s.mu.Lock()
		ts := s.sessions[id]
		if ts != nil {
			ts.since = l.StateSince
			switch {
			case maps.Equal(ts.tokens, tokens):
			case onlyAdded(ts.tokens, tokens):
				// A reauth adds the new peers to the live session.
				ts.tokens = tokens
				s.mu.Unlock()
				s.log.Info("upstream peers added: reauthorizing", "tenant", l.TenantName, "peers", l.Peers)
				ts.shell.SetPeers(tokens)
				continue
			default:
				// A reauth only adds: a changed or removed token would
				// leave the live session authorized by the old one, and
				// a wrong new one would never fail the link. A fresh
				// session proves the tokens the link holds now.
				delete(s.sessions, id)
				s.mu.Unlock()
				s.log.Info("upstream tokens changed: starting a new session with them", "tenant", l.TenantName, "peers", l.Peers)
				s.stop(ts)
				s.start(ctx, l, tokens)
				continue
			}
		}
		s.mu.Unlock()
		if ts == nil {
			s.start(ctx, l, tokens)
		}
	}
}

// tokens opens the link's tokens. Tokens that do not open (another
// encryption key) fail the link, as a rejection would: the operator must
// set it again.
func (s *Supervisor) tokens(ctx context.Context, l proxystore.Link) (map[string]string, error) {
	peers, err := s.cfg.Store.LinkTokens(ctx, l.TenantID)
	switch {
	case errors.Is(err, sealbox.ErrOpen):
		s.log.Error("the link's sealed tokens do not open with this proxy's encryption key: link failing", "tenant", l.TenantName)
		s.markFailing(l.TenantID, l.TenantName, "the sealed tokens do not open with the proxy's encryption key: set the link again")
		return nil, err
	case errors.Is(err, sqldb.ErrNotFound):
		return nil, err // deleted meanwhile
	case err != nil:
		if ctx.Err() == nil {
			s.log.Warn("cannot read the link's tokens", "tenant", l.TenantName, "error", err)
		}
		return nil, err
	}
	tokens := make(map[string]string, len(peers))
	for _, p := range peers {
		tokens[p.PeerID] = p.Token
	}
	return tokens, nil
}

// start runs a session shell for the tenant's link.
func (s *Supervisor) start(ctx context.Context, l proxystore.Link, tokens map[string]string) {
	ts := &tenantSession{tenantID: l.TenantID, tenant: l.TenantName, url: l.URL, workerID: l.WorkerID, tokens: tokens,
		since: l.StateSince, registry: prometheus.NewRegistry(), done: make(chan struct{})}
	log := s.log.With("tenant", l.TenantName)
	cfg := s.cfg.Session
	cfg.ServerURL, cfg.WorkerID = l.URL, l.WorkerID
	cfg.PeersFile, cfg.Peers = "", peersText(tokens)
	cfg.Capabilities = s.cfg.Capabilities
	cfg.ListenAddr, cfg.Listener = "", nil
	cfg.OnEstablished = func() { s.established(ts) }
	cfg.OnRejected = func(code uint16, reason string) bool { return s.rejected(ts, code, reason) }
	// By ID: /metrics answers without a token, and a tenant's name may be
	// a customer's.
	cfg.Metrics = prometheus.WrapRegistererWith(prometheus.Labels{"tenant": l.TenantID}, ts.registry)
	cfg.Logger = log
	h := &tenantHandler{s: s, tenantID: l.TenantID}
	if s.cfg.Hubs != nil {
		h.hub = s.cfg.Hubs.Tenant(l.TenantID)
	}
	sh, err := workersession.New(cfg, h)
	if err != nil {
		log.Error("cannot start the upstream session", "error", err)
		return
	}
	ts.shell = sh
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ts.cancel = cancel
	s.mu.Lock()
	s.sessions[l.TenantID] = ts
	s.mu.Unlock()
	log.Info("starting the upstream session", "server", gitsource.Redact(l.URL), "worker_id", l.WorkerID, "peers", l.Peers)
	go func() {
		defer close(ts.done)
		if err := sh.Run(runCtx); err != nil {
			log.Error("upstream session stopped", "error", err)
		}
	}()
}

// stop ends a tenant's session shell and waits for it (no jobs run on
// it, so its stop sequence is Draining and a close; the hub then aborts
// the tenant's jobs behind the proxy).
func (s *Supervisor) stop(ts *tenantSession) {
	s.log.Info("stopping the upstream session", "tenant", ts.tenant)
	ts.cancel()
	<-ts.done
}

func (s *Supervisor) stopAll() {
	s.mu.Lock()
	all := make([]*tenantSession, 0, len(s.sessions))
	for id, ts := range s.sessions {
		all = append(all, ts)
		delete(s.sessions, id)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, ts := range all {
		wg.Go(func() { s.stop(ts) })
	}
	wg.Wait()
}

// current reports whether ts is still the tenant's session.
func (s *Supervisor) current(ts *tenantSession) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[ts.tenantID] == ts
}

// established marks the link OK: its credentials hold.
func (s *Supervisor) established(ts *tenantSession) {
	s.mu.Lock()
	ts.connectedAt = time.Now()
	s.mu.Unlock()
	if !s.current(ts) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.cfg.Store.MarkLinkOK(ctx, ts.tenantID); err != nil {
		s.log.Warn("cannot mark the link ok", "tenant", ts.tenant, "error", err)
	}
}

// rejected answers the shell's OnRejected: a 401 or 403 fails the link
// with the server's reason and stops the dialing; anything else backs
// off and dials again.
func (s *Supervisor) rejected(ts *tenantSession, code uint16, reason string) bool {
	if code != 401 && code != 403 {
		return false
	}
	s.mu.Lock()
	since := ts.since
	isCurrent := s.sessions[ts.tenantID] == ts
	if isCurrent {
		s.refused[ts.tenantID] = since
	}
	s.mu.Unlock()
	if !isCurrent {
		return true // replaced: its link changed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A link set again meanwhile carries new credentials: leave it be.
	if l, err := s.cfg.Store.Link(ctx, ts.tenantID); err != nil || !l.StateSince.Equal(since) || l.URL != ts.url || l.WorkerID != ts.workerID {
		s.Changed()
		return true
	}
	s.log.Warn("the tenant's server rejected the proxy: link failing until it is set again",
		"tenant", ts.tenant, "code", code, "reason", reason)
	s.markFailing(ts.tenantID, ts.tenant, fmt.Sprintf("rejected with %d: %s", code, reason))
	s.Changed()
	return true
}

func (s *Supervisor) markFailing(tenantID, tenant, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.cfg.Store.MarkLinkFailing(ctx, tenantID, reason); err != nil {
		s.log.Error("cannot mark the link failing", "tenant", tenant, "error", err)
	}
}

// Gather collects the sessions' series (prometheus.Gatherer).
func (s *Supervisor) Gather() ([]*dto.MetricFamily, error) {
	s.mu.Lock()
	gatherers := make(prometheus.Gatherers, 0, len(s.sessions))
	for _, ts := range s.sessions {
		gatherers = append(gatherers, ts.registry)
	}
	s.mu.Unlock()
	return gatherers.Gather()
}

// onlyAdded: next keeps every peer of prev with its token and adds some.
func onlyAdded(prev, next map[string]string) bool {
	for id, token := range prev {
		if t, ok := next[id]; !ok || t != token {
			return false
		}
	}
	return true
}

// peersText is tokens as peers-file lines, the shell's inline peers.
func peersText(tokens map[string]string) string {
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(tokens)) {
		b.WriteString(id + ":" + tokens[id] + "\n")
	}
	return b.String()
}
