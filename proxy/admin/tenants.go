package admin

import (
	"errors"
	"net/http"

	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb"
)

// tenantDetail is one tenant with its link and how many workers it has.
type tenantDetail struct {
	proxystore.Tenant
	Link    *linkView `json:"link"`
	Workers int       `json:"workers"`
}

func (a *API) createTenant(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name string `json:"name"`
	}
	if err := jsonapi.Decode(w, r, &in); err != nil {
		a.fail(w, r, err)
		return
	}
	t, err := a.store.CreateTenant(r.Context(), in.Name)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("admin: tenant created", "tenant", t.Name, "tenant_id", t.ID)
	jsonapi.Write(w, http.StatusCreated, t)
}

func (a *API) listTenants(w http.ResponseWriter, r *http.Request) {
	ts, err := a.store.Tenants(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	jsonapi.Write(w, http.StatusOK, ts)
}

func (a *API) showTenant(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	t, err := a.store.Tenant(ctx, r.PathValue("tenant"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	d := tenantDetail{Tenant: t}
	l, err := a.store.Link(ctx, t.ID)
	switch {
	case err == nil:
		v := a.linkView(l)
		d.Link = &v
	case !errors.Is(err, sqldb.ErrNotFound):
		a.fail(w, r, err)
		return
	}
	workers, err := a.store.Workers(ctx, t.ID)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	d.Workers = len(workers)
	jsonapi.Write(w, http.StatusOK, d)
}

// deleteTenant revokes the tenant's workers (their rows go and their live
// sessions close, as DELETE /workers/{id} does), then deletes the tenant
// with its link and sealed tokens; the upstream session stops. A tenant
// with a running VM is refused (409) before any worker is revoked.
func (a *API) deleteTenant(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	t, err := a.store.Tenant(ctx, r.PathValue("tenant"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	vms, err := a.store.OpenVMs(ctx)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	for _, vm := range vms {
		if vm.TenantID == t.ID {
			a.fail(w, r, sqldb.Conflict("tenant %q has running VMs; disable its Hetzner workers and wait until they are deleted", t.Name))
			return
		}
	}
	workers, err := a.store.Workers(ctx, t.ID)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	for _, wk := range workers {
		if err := a.cfg.Downstream.Revoke(ctx, wk.ID); err != nil && !errors.Is(err, sqldb.ErrNotFound) {
			a.fail(w, r, err)
			return
		}
	}
	// Workers created meanwhile go with the tenant's rows (the
	// database cascades); they hold no session yet.
	if err := a.store.DeleteTenant(ctx, t.ID); err != nil {
		a.fail(w, r, err)
		return
	}
	a.cfg.Upstream.Changed()
	if a.cfg.TenantDeleted != nil {
		a.cfg.TenantDeleted(t.ID)
	}
	a.log.Info("admin: tenant deleted: its workers revoked, its upstream session stopping", "tenant", t.Name,
		"tenant_id", t.ID, "workers_revoked", len(workers))
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) setMayRun(w http.ResponseWriter, r *http.Request) {
	var in struct {
		MayRun *bool `json:"may_run"`
	}
	if err := jsonapi.Decode(w, r, &in); err != nil {
		a.fail(w, r, err)
		return
	}
	if in.MayRun == nil {
		a.fail(w, r, sqldb.Invalid(`send {"may_run": true} or {"may_run": false}`))
		return
	}
	t, err := a.store.SetTenantMayRun(r.Context(), r.PathValue("tenant"), *in.MayRun)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.cfg.Upstream.Changed()
	a.log.Info("admin: tenant may run set", "tenant", t.Name, "may_run", t.MayRun)
	jsonapi.Write(w, http.StatusOK, t)
}
