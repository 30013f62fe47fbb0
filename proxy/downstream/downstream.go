// Package downstream is the federation proxy's downstream leg
// (docs/protocol/federation.md "Downstream Leg"): the proxy is the authority of its
// own workers, authorized from proxystore's rows, tracks each tenant's
// live workers for the tenant's upstream aggregate, and joins each
// worker to its tenant's hub (proxy/hub), which gets the worker's job
// and cache messages.
package downstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/proxy/upstream"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage/sqldb"
	"gradient.dev/gradient/wire"
)

// RevokedReason closes the session of a revoked worker.
const RevokedReason = "worker revoked"

// Config configures the downstream leg.
type Config struct {
	Store *proxystore.Store
	// PoolChanged is told the tenant ID whenever one of its workers
	// joins, leaves, drains, sends WorkerCapabilities that differ from
	// its last ones, or its first WorkerMetrics (the upstream
	// Supervisor's PoolChanged). Nil tells no one.
	PoolChanged func(tenantID string)
	// Hubs forward each tenant's jobs; nil forwards nothing (a RequestJob
	// gets no job, a job list is empty, cache messages are ignored).
	Hubs *hub.Set
	// Authority is the template of the authority's configuration
	// (timeouts, limits); the leg sets its policy, job loop, logger and
	// metrics.
	Authority authority.Config
	Logger    *slog.Logger
	Metrics   prometheus.Registerer
	// ObserveTokenCheck hears each argon2 check of a worker's token.
	ObserveTokenCheck func(elapsed time.Duration, matched bool)
}

// Leg authorizes the proxy's workers and serves their sessions. It is
// the authority's Policy and JobLoop, and the upstream Supervisor's Pool.
type Leg struct {
	store   *proxystore.Store
	changed func(tenantID string)
	log     *slog.Logger
	tokens  *secret.Verifier
	auth    *authority.Authority

	// mu guards what follows. Lock order (docs/LOCKS.md): l.mu →
	// hub.Set.mu (SessionStarted); the hub's methods are called after
	// it is released.
	mu sync.Mutex
	// tenantOf is the tenant of each worker ID as its last accepted
	// authorization read it, for SessionStarted.
	tenantOf map[string]string
	// live is each tenant's established sessions, by session number.
	live map[string]map[uint64]*authority.LiveWorker
	// sessionTenant is the tenant each live session counts for.
	sessionTenant map[uint64]string
	// reported is what each live session's pool changes counted.
	reported map[uint64]*reported
	// revoked are the worker IDs Revoke removed (IDs are never reused):
	// a handshake that read the row just before the delete is refused
	// or closed on start.
	revoked map[string]bool
	// joined is each live session's place in its tenant's hub.
	joined map[uint64]*member

	hubs *hub.Set
}

// member is a live session as its tenant's hub sees it (hub.Downstream):
// sends go through a bounded Outbox.
type member struct {
	w      *authority.LiveWorker
	hub    *hub.Hub
	outbox *hub.Outbox
}

func (m *member) Session() uint64             { return m.w.Session }
func (m *member) WorkerID() string            { return m.w.WorkerID }
func (m *member) Send(msg wire.ServerMessage) { m.outbox.Send(msg) }
func (m *member) Relay(msg wire.ServerMessage, frame []byte, ver uint16) bool {
	return m.outbox.Relay(msg, frame, ver)
}
func (m *member) Capabilities() wire.GradientCapabilities { return m.w.Capabilities() }
func (m *member) Host() *wire.WorkerCapabilities          { return m.w.WorkerCapabilities() }
func (m *member) Draining() bool                          { return m.w.Draining() }
func (m *member) Backlog() int                            { return m.outbox.Backlog() }
func (m *member) WhenDrained(bytes int, f func())         { m.outbox.WhenDrained(bytes, f) }

// Close ends the session once what the hub queued before went out.
func (m *member) Close(reason string) {
	m.outbox.Finish(func() { m.w.Close(session.CloseGoingAway, reason) })
}

var (
	_ hub.Relayer       = (*member)(nil)
	_ authority.Policy  = (*Leg)(nil)
	_ authority.JobLoop = (*Leg)(nil)
	_ upstream.Pool     = (*Leg)(nil)
)

// New builds the leg and its authority; Close ends every session.
func New(cfg Config) (*Leg, error) {
	if cfg.Store == nil {
		return nil, errors.New("downstream: a store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PoolChanged == nil {
		cfg.PoolChanged = func(string) {}
	}
	l := &Leg{store: cfg.Store, changed: cfg.PoolChanged, log: cfg.Logger, tokens: secret.NewVerifier(0),
		tenantOf: map[string]string{}, live: map[string]map[uint64]*authority.LiveWorker{}, sessionTenant: map[uint64]string{}, reported: map[uint64]*reported{}, revoked: map[string]bool{},
		joined: map[uint64]*member{}, hubs: cfg.Hubs}
	l.tokens.Observe = cfg.ObserveTokenCheck
	ac := cfg.Authority
	// vmTokens adds the rule of Hetzner VMs' one-time tokens (vmtoken.go).
	ac.Policy, ac.Jobs, ac.Logger, ac.Metrics = vmTokens{l}, l, cfg.Logger, cfg.Metrics
	// Federate is reserved and never negotiated through the proxy.
	ac.Federate = false
	ac.MetricsPrefix = "gradient_proxy_downstream"
	if l.hubs != nil {
		// The tenant's server is the cache: the hub passes through.
		ac.Cache = func(s authority.CacheSession) authority.CacheHandler { return passthrough{l: l, w: s.Worker} }
	}
	l.auth = authority.New(ac)
	return l, nil
}

// Authority serves the workers' sessions (ProtoHandler, WorkerStatus).
func (l *Leg) Authority() *authority.Authority { return l.auth }

// Close ends every downstream session (1001) and waits for them.
func (l *Leg) Close() { l.auth.Close() }

// row is the worker's row; ok false when there is none (or the ID is no
// UUID, which no row can have).
func (l *Leg) row(ctx context.Context, workerID string) (proxystore.Worker, bool, error) {
	w, err := l.store.WorkerByID(ctx, workerID)
	switch {
	case errors.Is(err, sqldb.ErrNotFound), errors.Is(err, sqldb.ErrInvalid):
		return proxystore.Worker{}, false, nil
	case err != nil:
		return proxystore.Worker{}, false, fmt.Errorf("reading worker %s: %w", workerID, err)
	}
	return w, true, nil
}

// Challenge names only the worker's own ID (docs/protocol/federation.md).
func (l *Leg) Challenge(ctx context.Context, workerID string) ([]string, bool, error) {
	w, ok, err := l.row(ctx, workerID)
	if err != nil || !ok {
		return nil, false, err
	}
	return []string{w.ID}, true, nil
}

// Authorize checks the token for the worker's own ID against the row's
// argon2id hash. The negotiated capabilities are the offer AND the row's
// allowed set; federate is never allowed.
//
// Only the first token offered for the worker's ID is checked, as the
// server checks one token per challenged peer (duplicates: the first
// wins): one AuthResponse costs at most one argon2id check, however many
// tokens it carries.
func (l *Leg) Authorize(ctx context.Context, workerID string, tokens []wire.Pair[string, string]) (authority.Grant, error) {
	w, ok, err := l.row(ctx, workerID)
	if err != nil {
		return authority.Grant{}, err
	}
	if !ok {
		return authority.Grant{Decision: handshake.UnknownWorker.Decide(), WorkerID: workerID}, nil
	}
	if token, offered := ownToken(tokens, w.ID); offered && l.tokens.Verify(w.TokenHash, token) {
		allowed := wire.GradientCapabilities{Fetch: w.Allowed.Fetch, Eval: w.Allowed.Eval, Build: w.Allowed.Build}
		l.mu.Lock()
		revoked := l.revoked[w.ID]
		if !revoked {
			l.tenantOf[w.ID] = w.TenantID
		}
		l.mu.Unlock()
		if revoked {
			return authority.Grant{Decision: handshake.UnknownWorker.Decide(), WorkerID: w.ID}, nil
		}
		return authority.Grant{
			Decision: handshake.Accept([]string{w.ID}, nil, allowed),
			WorkerID: w.ID, Known: true,
			Abilities: authority.Abilities{Fetch: w.Allowed.Fetch, Eval: w.Allowed.Eval, Build: w.Allowed.Build},
		}, nil
	}
	return authority.Grant{Decision: handshake.NoValidTokens.Decide(), WorkerID: w.ID, Known: true}, nil
}

// ownToken is the first token offered for the worker's own ID (the one
// peer the leg challenges); tokens for other peers are ignored.
func ownToken(tokens []wire.Pair[string, string], workerID string) (string, bool) {
	for _, t := range tokens {
		if strings.EqualFold(t.First, workerID) {
			return t.Second, true
		}
	}
	return "", false
}

// Revoke deletes the worker's row and closes its live session at once.
func (l *Leg) Revoke(ctx context.Context, workerID string) error {
	w, err := l.store.WorkerByID(ctx, workerID)
	if err != nil {
		return err
	}
	if err := l.store.DeleteWorker(ctx, w.ID); err != nil {
		return err
	}
	l.mu.Lock()
	delete(l.tenantOf, w.ID)
	l.revoked[w.ID] = true
	l.mu.Unlock()
	l.auth.Disconnect(w.ID, RevokedReason)
	return nil
}

// SessionStarted counts the worker for its tenant.
func (l *Leg) SessionStarted(w *authority.LiveWorker) {
	l.mu.Lock()
	tenant, ok := l.tenantOf[w.WorkerID]
	ok = ok && !l.revoked[w.WorkerID]
	var m *member
	if ok {
		if l.live[tenant] == nil {
			l.live[tenant] = map[uint64]*authority.LiveWorker{}
		}
		l.live[tenant][w.Session] = w
		l.sessionTenant[w.Session] = tenant
		if l.hubs != nil {
			h := l.hubs.Tenant(tenant)
			m = &member{w: w, hub: h}
			cutOff := func(reason string) { w.Drop("slow consumer: " + reason) }
			if out := w.Writer(); out != nil {
				m.outbox = h.NewWriterOutbox(w.WorkerID, out, cutOff)
			} else {
				m.outbox = h.NewOutbox(w.WorkerID, w.Send, cutOff)
			}
			l.joined[w.Session] = m
		}
	}
	l.mu.Unlock()
	if !ok {
		// Revoked between its authorization and now: Revoke's
		// Disconnect closes it.
		l.auth.Disconnect(w.WorkerID, RevokedReason)
		return
	}
	if m != nil {
		m.hub.Join(m)
	}
	l.changed(tenant)
}

// joinedAs is the session's hub membership, nil without one.
func (l *Leg) joinedAs(w *authority.LiveWorker) *member {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.joined[w.Session]
}

// passthrough is a session's cache handler: its tenant's hub forwards
// the messages to the tenant's server. Nothing is stored on the proxy.
type passthrough struct {
	l *Leg
	w *authority.LiveWorker
}

// Handle passes m on; an UploadChunk's payload is encoded into the
// upstream frame before Handle returns.
func (p passthrough) Handle(m wire.ClientMessage) {
	if j := p.l.joinedAs(p.w); j != nil {
		j.hub.FromWorker(j, m)
	}
}

func (passthrough) Close() {}

// HandleJobMessage hands the worker's job messages to its tenant's hub
// (without hubs a RequestJob gets no job and a job list is empty). What
// also changes the tenant's aggregate is a pool change: Draining,
// WorkerCapabilities that differ from the session's last ones, and a
// session's first WorkerMetrics. Later heartbeats change only the load
// figures, which the upstream session's own heartbeat carries, so no
// heartbeat is a pool change.
func (l *Leg) HandleJobMessage(w *authority.LiveWorker, m wire.ClientMessage) {
	switch m := m.(type) {
	case *wire.WorkerCapabilities, *wire.WorkerMetrics, *wire.ClientDraining:
		if tenant, ok := l.tenantOfSession(w); ok && l.changesPool(w, m) {
			l.changed(tenant)
		}
	}
	if j := l.joinedAs(w); j != nil {
		j.hub.FromWorker(j, m)
		return
	}
	authority.NoJobs{}.HandleJobMessage(w, m)
}

// reported is what the tenant's aggregate last counted of a session's
// host.
type reported struct {
	host   *wire.WorkerCapabilities
	loaded bool // a WorkerMetrics came
}

// changesPool reports whether m changes what the aggregate counts of w,
// and notes it.
func (l *Leg) changesPool(w *authority.LiveWorker, m wire.ClientMessage) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.reported[w.Session]
	if r == nil {
		if _, live := l.sessionTenant[w.Session]; !live {
			return false
		}
		r = &reported{}
		l.reported[w.Session] = r
	}
	switch m := m.(type) {
	case *wire.WorkerCapabilities:
		if r.host != nil && sameHost(r.host, m) {
			return false
		}
		r.host = m
	case *wire.WorkerMetrics:
		if r.loaded {
			return false
		}
		r.loaded = true
	}
	return true
}

// sameHost compares what the aggregate takes from WorkerCapabilities.
func sameHost(a, b *wire.WorkerCapabilities) bool {
	return slices.Equal(a.Architectures, b.Architectures) && slices.Equal(a.SystemFeatures, b.SystemFeatures) &&
		a.MaxConcurrentBuilds == b.MaxConcurrentBuilds && a.CPUCount == b.CPUCount &&
		a.RAMTotalMB == b.RAMTotalMB && a.CPUCoreScore == b.CPUCoreScore
}

// SessionEnded takes the worker out of its tenant's pool and hub: the
// hub fails its jobs upstream as transient.
func (l *Leg) SessionEnded(w *authority.LiveWorker, reason string) {
	l.mu.Lock()
	tenant, ok := l.sessionTenant[w.Session]
	m := l.joined[w.Session]
	delete(l.joined, w.Session)
	if ok {
		delete(l.sessionTenant, w.Session)
		delete(l.reported, w.Session)
		delete(l.live[tenant], w.Session)
		if len(l.live[tenant]) == 0 {
			delete(l.live, tenant)
		}
	}
	l.mu.Unlock()
	if m != nil {
		m.hub.Leave(m, reason)
		m.outbox.Close()
	}
	if ok {
		l.changed(tenant)
	}
}

func (l *Leg) tenantOfSession(w *authority.LiveWorker) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.sessionTenant[w.Session]
	return t, ok
}

// Members are the tenant's live workers (upstream.Pool), with what each
// session last reported of its host and load.
func (l *Leg) Members(tenantID string) []upstream.Member {
	l.mu.Lock()
	workers := make([]*authority.LiveWorker, 0, len(l.live[tenantID]))
	for _, w := range l.live[tenantID] {
		workers = append(workers, w)
	}
	l.mu.Unlock()
	out := make([]upstream.Member, 0, len(workers))
	for _, w := range workers {
		out = append(out, upstream.Member{Capabilities: w.Capabilities(), Host: w.WorkerCapabilities(), Metrics: w.WorkerMetrics(), Draining: w.Draining()})
	}
	return out
}
