package hub

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// ScoreInterval is how often changed scores go upstream (docs/protocol/federation.md:
// once per second).
const ScoreInterval = time.Second

// BookRefresh is how often each hub asks its upstream for the full offer
// list, dropping candidates taken elsewhere.
const BookRefresh = 30 * time.Second

// Set is the proxy's hubs, one per tenant ID, shared by the downstream
// leg (which joins each worker to its tenant's hub) and the upstream
// supervisor (which forwards each tenant's session to it).
type Set struct {
	log *slog.Logger
	m   *Metrics

	mu     sync.Mutex
	hubs   map[string]*Hub
	limits Limits
}

// NewSet makes an empty set; m may be nil.
func NewSet(log *slog.Logger, m *Metrics) *Set {
	if log == nil {
		log = slog.Default()
	}
	return &Set{log: log, m: m, hubs: map[string]*Hub{}, limits: DefaultLimits}
}

// SetLimits bounds what each tenant's upstream session makes its hub
// hold (zero fields: DefaultLimits'); call it before the hubs are used.
func (s *Set) SetLimits(l Limits) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits = l.withDefaults()
	for _, h := range s.hubs {
		h.mu.Lock()
		h.limits = s.limits
		h.mu.Unlock()
	}
}

// Tenant is the hub of tenantID, made on first use.
func (s *Set) Tenant(tenantID string) *Hub {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.hubs[tenantID]
	if h == nil {
		h = New(tenantID, s.log, s.m)
		h.limits = s.limits
		s.hubs[tenantID] = h
	}
	return h
}

// Remove forgets the tenant's hub and its series, after the tenant was
// deleted (its sessions are closed). A later Tenant makes a new hub, but
// the removed tenant's series stay gone.
func (s *Set) Remove(tenantID string) {
	s.mu.Lock()
	delete(s.hubs, tenantID)
	s.mu.Unlock()
	s.m.forget(tenantID)
	s.log.Info("removed the hub of a deleted tenant", "tenant_id", tenantID)
}

// Len is how many hubs the set holds.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.hubs)
}

// Run flushes every hub's changed scores once per ScoreInterval and
// refreshes its book once per BookRefresh until ctx ends.
func (s *Set) Run(ctx context.Context) {
	t := time.NewTicker(ScoreInterval)
	defer t.Stop()
	refresh := time.NewTicker(BookRefresh)
	defer refresh.Stop()
	for {
		var each func(*Hub)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			each = (*Hub).FlushScores
		case <-refresh.C:
			each = (*Hub).RefreshBook
		}
		for _, h := range s.all() {
			each(h)
		}
	}
}

func (s *Set) all() []*Hub {
	s.mu.Lock()
	defer s.mu.Unlock()
	hubs := make([]*Hub, 0, len(s.hubs))
	for _, h := range s.hubs {
		hubs = append(hubs, h)
	}
	return hubs
}

// PendingJobs is the tenant's book's build candidates per Nix system
// (hetzner.Demand).
func (s *Set) PendingJobs(tenantID string) map[string]int {
	s.mu.Lock()
	h := s.hubs[tenantID]
	s.mu.Unlock()
	if h == nil {
		return nil // no hub made for a question
	}
	return h.Pending()
}

// NewOutbox is an Outbox for a worker of hub h, its queue wait and cut
// offs counted in h's tenant's series and logged.
func (h *Hub) NewOutbox(workerID string, send func(wire.ServerMessage) error, cutOff func(reason string)) *Outbox {
	return h.outbox(workerID, funcSink(send), cutOff)
}

// NewWriterOutbox is NewOutbox for a worker session's writer (see
// hub.NewWriterOutbox).
func (h *Hub) NewWriterOutbox(workerID string, w *session.Writer[wire.ServerMessage], cutOff func(reason string)) *Outbox {
	return h.outbox(workerID, writerSink{w}, cutOff)
}

func (h *Hub) outbox(workerID string, s sink, cutOff func(reason string)) *Outbox {
	o := newOutbox(s, func(reason string) {
		h.log.Warn("cutting off a slow worker behind the proxy", "worker", workerID, "reason", reason)
		h.m.slowWorker(h.tenant)
		cutOff(reason)
	})
	if h.m != nil {
		o.observe(func(d time.Duration) { h.m.waited(h.tenant, d) })
	}
	return o
}
