package upstream

import (
	"slices"
	"strings"
	"time"
)

// Status is one tenant's upstream session as the operator sees it: the
// link it runs (never its tokens) and whether it is established now.
type Status struct {
	TenantID string `json:"tenant_id"`
	Tenant   string `json:"tenant"`
	URL      string `json:"url"`
	WorkerID string `json:"worker_id"`
	// Live: a session with the tenant's server is established now;
	// otherwise the worker is dialing or backing off.
	Live bool `json:"live"`
	// ConnectedAt is when the last session was established (zero
	// before the first one).
	ConnectedAt time.Time `json:"connected_at,omitzero"`
	// Peers are the IDs of the peers whose tokens the session presents.
	Peers []string `json:"peers"`
}

// Status is the tenant's upstream session, false while the supervisor
// runs none for it (link disabled, tenant may not run, link failing, or
// not read yet since the last change).
func (s *Supervisor) Status(tenantID string) (Status, bool) {
	s.mu.Lock()
	ts := s.sessions[tenantID]
	s.mu.Unlock()
	if ts == nil {
		return Status{}, false
	}
	return ts.status(s), true
}

// Statuses are every upstream session the supervisor runs, by tenant
// name.
func (s *Supervisor) Statuses() []Status {
	s.mu.Lock()
	all := make([]*tenantSession, 0, len(s.sessions))
	for _, ts := range s.sessions {
		all = append(all, ts)
	}
	s.mu.Unlock()
	out := make([]Status, 0, len(all))
	for _, ts := range all {
		out = append(out, ts.status(s))
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

func (ts *tenantSession) status(s *Supervisor) Status {
	s.mu.Lock()
	st := Status{TenantID: ts.tenantID, Tenant: ts.tenant, URL: ts.url, WorkerID: ts.workerID, ConnectedAt: ts.connectedAt}
	for id := range ts.tokens {
		st.Peers = append(st.Peers, id)
	}
	s.mu.Unlock()
	slices.Sort(st.Peers)
	st.Live = ts.shell.Connected()
	return st
}
