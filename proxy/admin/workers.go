package admin

import (
	"net/http"
	"strings"
	"time"

	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb"
)

// workerCreated answers a worker's creation: its token, this once.
type workerCreated struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	Tenant       string    `json:"tenant"`
	TenantID     string    `json:"tenant_id"`
	Capabilities []string  `json:"capabilities"`
	Token        string    `json:"token"`
	CreatedAt    time.Time `json:"created_at"`
}

// workerView is one of the proxy's workers with its live state.
type workerView struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Tenant   string `json:"tenant"`
	TenantID string `json:"tenant_id"`
	// Capabilities are the allowed ones; a live session negotiates
	// those its worker offers too (Negotiated).
	Capabilities  []string  `json:"capabilities"`
	CreatedAt     time.Time `json:"created_at"`
	Live          bool      `json:"live"`
	ConnectedAt   time.Time `json:"connected_at,omitzero"`
	Negotiated    []string  `json:"negotiated,omitempty"`
	Draining      bool      `json:"draining"`
	OfflineReason string    `json:"offline_reason,omitempty"`
	OfflineSince  time.Time `json:"offline_since,omitzero"`
	// HoldsJob: the live worker holds a job the proxy forwarded to it.
	HoldsJob bool `json:"holds_job"`
}

// downstreamSession is one live session of the proxy's own workers.
type downstreamSession struct {
	WorkerID     string    `json:"worker_id"`
	Name         string    `json:"name"`
	Tenant       string    `json:"tenant"`
	ConnectedAt  time.Time `json:"connected_at"`
	Capabilities []string  `json:"capabilities"`
	Draining     bool      `json:"draining"`
}

func capabilityNames(c proxystore.Capabilities) []string {
	if names := c.Wire().Names(); names != nil {
		return names
	}
	return []string{}
}

// parseAllowed reads a worker's allowed capabilities: fetch, eval and
// build, never federate; absent means all three.
func parseAllowed(list *[]string) (proxystore.Capabilities, error) {
	if list == nil {
		return proxystore.Capabilities{Fetch: true, Eval: true, Build: true}, nil
	}
	var c proxystore.Capabilities
	for _, name := range *list {
		if strings.Contains(name, ",") {
			return c, sqldb.Invalid("capability %q: give each capability as its own list element", name)
		}
		one, err := proxystore.ParseCapabilities(name)
		if err != nil {
			return c, err
		}
		c.Fetch, c.Eval, c.Build = c.Fetch || one.Fetch, c.Eval || one.Eval, c.Build || one.Build
	}
	if c == (proxystore.Capabilities{}) {
		return c, sqldb.Invalid("capabilities is empty: allow some of fetch, eval, build (or leave it out for all three)")
	}
	return c, nil
}

func (a *API) createWorker(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name         string    `json:"name"`
		Capabilities *[]string `json:"capabilities"`
	}
	if err := jsonapi.Decode(w, r, &in); err != nil {
		a.fail(w, r, err)
		return
	}
	allowed, err := parseAllowed(in.Capabilities)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ctx := r.Context()
	t, err := a.store.Tenant(ctx, r.PathValue("tenant"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	wk, token, err := a.store.CreateWorker(ctx, t.ID, in.Name, allowed)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("admin: worker created", "tenant", t.Name, "worker", wk.ID, "name", wk.Name, "capabilities", allowed.String())
	jsonapi.Write(w, http.StatusCreated, workerCreated{ID: wk.ID, Name: wk.Name, Tenant: t.Name, TenantID: t.ID,
		Capabilities: capabilityNames(wk.Allowed), Token: token, CreatedAt: wk.CreatedAt})
}

// listWorkers lists the workers of one tenant (?tenant=) or of all, by
// tenant and name, with their live state.
func (a *API) listWorkers(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var tenants []proxystore.Tenant
	if ref := r.URL.Query().Get("tenant"); ref != "" {
		t, err := a.store.Tenant(ctx, ref)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		tenants = []proxystore.Tenant{t}
	} else if r.URL.Query().Has("tenant") {
		a.fail(w, r, sqldb.Invalid("tenant is empty: name a tenant, or leave the parameter out for all"))
		return
	} else {
		var err error
		if tenants, err = a.store.Tenants(ctx); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	out, err := a.Workers(ctx, tenants)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	jsonapi.Write(w, http.StatusOK, out)
}

// revokeWorker deletes the worker's row and closes its live session.
func (a *API) revokeWorker(w http.ResponseWriter, r *http.Request) {
	id, err := sqldb.CanonicalUUID("worker ID", r.PathValue("worker"))
	if err == nil {
		err = a.cfg.Downstream.Revoke(r.Context(), id)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("admin: worker revoked: its row deleted, its session closing", "worker", id)
	w.WriteHeader(http.StatusNoContent)
}
