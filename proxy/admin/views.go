package admin

import (
	"context"
	"errors"
	"time"

	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb"
)

// The views below are what the API's GET answers carry, as Go values: the
// proxy's dashboard (proxy/dashboard) reads them after its own session
// check, so the JSON API and the pages show the same data.
type (
	LinkView          = linkView
	WorkerView        = workerView
	DownstreamSession = downstreamSession
	SessionsView      = sessionsView
	UsageView         = usageView
)

// TenantView is one tenant with its link (nil without one).
type TenantView struct {
	proxystore.Tenant
	Link *LinkView
}

// CheckToken reports whether token is the admin token (argon2id, constant
// time, through the API's verifier); false while the API has none. The
// caller counts failures (internal/authgate).
func (a *API) CheckToken(token string) bool {
	return a.auth.Hash != "" && token != "" && a.auth.Tokens.Verify(a.auth.Hash, token)
}

// Tenants is every tenant with its link's state and session.
func (a *API) Tenants(ctx context.Context) ([]TenantView, error) {
	ts, err := a.store.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]TenantView, 0, len(ts))
	for _, t := range ts {
		v := TenantView{Tenant: t}
		l, err := a.store.Link(ctx, t.ID)
		switch {
		case err == nil:
			lv := a.linkView(l)
			v.Link = &lv
		case !errors.Is(err, sqldb.ErrNotFound):
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// busy is what the downstream leg may also tell: whether a worker holds a
// job the proxy forwarded (downstream.Leg.Busy).
type busy interface{ Busy(workerID string) bool }

// Workers is the workers of the given tenants (all when nil), by tenant
// and name, with their live state (GET /api/v1/workers).
func (a *API) Workers(ctx context.Context, tenants []proxystore.Tenant) ([]WorkerView, error) {
	if tenants == nil {
		var err error
		if tenants, err = a.store.Tenants(ctx); err != nil {
			return nil, err
		}
	}
	b, _ := a.cfg.Downstream.(busy)
	out := []workerView{}
	for _, t := range tenants {
		workers, err := a.store.Workers(ctx, t.ID)
		if err != nil {
			return nil, err
		}
		for _, wk := range workers {
			st := a.cfg.Downstream.WorkerStatus(wk.ID)
			v := workerView{ID: wk.ID, Name: wk.Name, Tenant: t.Name, TenantID: t.ID,
				Capabilities: capabilityNames(wk.Allowed), CreatedAt: wk.CreatedAt, Live: st.Live, ConnectedAt: st.ConnectedAt,
				Negotiated: st.Capabilities, Draining: st.Draining, OfflineReason: st.OfflineReason, OfflineSince: st.OfflineSince}
			v.HoldsJob = st.Live && b != nil && b.Busy(wk.ID)
			out = append(out, v)
		}
	}
	return out, nil
}

// Sessions is every session of both legs right now (GET /api/v1/sessions).
func (a *API) Sessions(ctx context.Context) (SessionsView, error) {
	out := sessionsView{Upstream: a.cfg.Upstream.Statuses(), Downstream: []downstreamSession{}}
	for i := range out.Upstream {
		if out.Upstream[i].Peers == nil {
			out.Upstream[i].Peers = []string{}
		}
	}
	tenants, err := a.store.Tenants(ctx)
	if err != nil {
		return out, err
	}
	for _, t := range tenants {
		workers, err := a.store.Workers(ctx, t.ID)
		if err != nil {
			return out, err
		}
		for _, wk := range workers {
			if st := a.cfg.Downstream.WorkerStatus(wk.ID); st.Live {
				out.Downstream = append(out.Downstream, downstreamSession{WorkerID: wk.ID, Name: wk.Name, Tenant: t.Name,
					ConnectedAt: st.ConnectedAt, Capabilities: st.Capabilities, Draining: st.Draining})
			}
		}
	}
	return out, nil
}

// Usage is the tenant's VMs that existed during [from, to) (zero: open)
// with the period's totals; a deleted tenant's bill is found by its ID or
// name (GET /api/v1/tenants/{tenant}/usage).
func (a *API) Usage(ctx context.Context, ref string, from, to time.Time) (UsageView, error) {
	vms, err := a.store.VMUsagesBetween(ctx, ref, from, to)
	if err != nil {
		return usageView{}, err
	}
	name := ref
	if t, err := a.store.Tenant(ctx, ref); err == nil {
		name = t.Name
	} else if !errors.Is(err, sqldb.ErrNotFound) || len(vms) == 0 {
		return usageView{}, err // neither a tenant nor a bill
	}
	out := usageView{Tenant: name, From: from, To: to, VMs: vms}
	now := time.Now()
	for _, v := range vms {
		out.BilledUnits += v.BilledUnits
		start, end := v.CreatedAt, now
		if v.DeletedAt != nil {
			end = *v.DeletedAt
		}
		if !from.IsZero() && start.Before(from) {
			start = from
		}
		if !to.IsZero() && end.After(to) {
			end = to
		}
		if end.After(start) {
			out.UptimeSeconds += int64(end.Sub(start) / time.Second)
		}
	}
	if out.VMs == nil {
		out.VMs = []proxystore.VMUsage{}
	}
	return out, nil
}
