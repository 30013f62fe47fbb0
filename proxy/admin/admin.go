// Package admin is the federation proxy's operator API under /api/v1:
// tenants, their upstream links, the proxy's own workers and the live
// sessions of both legs. It reads and writes proxystore itself and reaches
// the legs through the small interfaces its Config takes (Downstream,
// Upstream). Peer tokens of links never appear in an answer or a log; a
// worker's token appears once, in the answer that creates it.
package admin

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/proxy/upstream"
	"gradient.dev/gradient/secret"
)

// The proxy's JSON API, under /api/v1. Every request carries
// "Authorization: Bearer <admin token>". A tenant is its name or UUID; a
// worker is its UUID.
//
//	POST   /api/v1/tenants                         {name} → tenant
//	GET    /api/v1/tenants
//	GET    /api/v1/tenants/{tenant}                with its link (or null) and worker count
//	DELETE /api/v1/tenants/{tenant}                revokes its workers (rows deleted, sessions closed), stops its upstream session
//	PUT    /api/v1/tenants/{tenant}/may-run        {may_run}
//	PUT    /api/v1/tenants/{tenant}/link           {url, worker_id, peers: peers-file text} → link
//	GET    /api/v1/tenants/{tenant}/link
//	POST   /api/v1/tenants/{tenant}/link/enable
//	POST   /api/v1/tenants/{tenant}/link/disable
//	POST   /api/v1/tenants/{tenant}/workers        {name, capabilities?} → worker with its token, once
//	GET    /api/v1/workers                         ?tenant=T to filter; with live state
//	DELETE /api/v1/workers/{worker}                revoke: the row goes, the session closes
//	GET    /api/v1/sessions                        upstream and downstream sessions
//	PUT    /api/v1/tenants/{tenant}/hetzner        {enabled, max_vms, systems, snapshot_id | snapshot_label, ssh_keys, labels, capabilities?}
//	GET    /api/v1/tenants/{tenant}/hetzner
//	GET    /api/v1/tenants/{tenant}/usage          ?from=&to= (RFC 3339 or dates): its VMs in the period, billed units
//
// Errors are {"error": "sentence"}: 400 invalid input, 401 wrong or
// missing token, 404 unknown record, 409 conflict, 429 too many wrong
// tokens from the address (Retry-After), 503 API disabled.

// Downstream is what the API asks of the proxy's own workers' leg
// (downstream.Leg).
type Downstream interface {
	WorkerStatus(workerID string) authority.WorkerStatus
	// Revoke deletes the worker's row and closes its live session.
	Revoke(ctx context.Context, workerID string) error
}

// Upstream is what the API asks of the upstream leg (upstream.Supervisor).
type Upstream interface {
	Status(tenantID string) (upstream.Status, bool)
	Statuses() []upstream.Status
	// Changed makes the leg read the links at once.
	Changed()
}

// Config is the admin API's configuration, filled by gradient-proxy.
type Config struct {
	Store *proxystore.Store
	// AdminTokenHash is the hash (secret.Hash) of the token the API
	// requires. Empty disables the API (503).
	AdminTokenHash string
	// Gate holds back addresses with too many wrong admin tokens; nil
	// holds back nobody.
	Gate *authgate.Gate
	// ObserveTokenCheck hears each argon2 check of an admin token.
	ObserveTokenCheck func(elapsed time.Duration, matched bool)
	Downstream        Downstream
	Upstream          Upstream
	// AllowLinkLocalLinks lets a link's URL name a link-local or cloud
	// metadata address (internal/dialguard); off, setting one is a 400.
	AllowLinkLocalLinks bool
	// TenantDeleted, when set, learns each deleted tenant's ID after
	// its workers were revoked and its upstream session told to stop
	// (gradient-proxy removes the tenant's hub: hub.Set.Remove).
	TenantDeleted func(tenantID string)
	Logger        *slog.Logger
}

// API serves the proxy's admin endpoints.
type API struct {
	cfg   Config
	store *proxystore.Store
	log   *slog.Logger
	auth  *authgate.Bearer
}

// adminVerifyConcurrency is how many admin token checks (argon2id, ~19
// MiB each) run at once; a matched token is remembered.
const adminVerifyConcurrency = 4

// New builds the admin API.
func New(cfg Config) *API {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	tokens := secret.NewVerifier(adminVerifyConcurrency)
	tokens.Observe = cfg.ObserveTokenCheck
	return &API{cfg: cfg, store: cfg.Store, log: cfg.Logger, auth: &authgate.Bearer{
		Hash: cfg.AdminTokenHash, Realm: "gradient-proxy-admin", Tokens: tokens, Gate: cfg.Gate,
	}}
}

// Mount mounts the API under /api/v1 on mux.
func (a *API) Mount(mux *http.ServeMux) {
	api := http.NewServeMux()
	api.HandleFunc("POST /api/v1/tenants", a.createTenant)
	api.HandleFunc("GET /api/v1/tenants", a.listTenants)
	api.HandleFunc("GET /api/v1/tenants/{tenant}", a.showTenant)
	api.HandleFunc("DELETE /api/v1/tenants/{tenant}", a.deleteTenant)
	api.HandleFunc("PUT /api/v1/tenants/{tenant}/may-run", a.setMayRun)
	api.HandleFunc("PUT /api/v1/tenants/{tenant}/link", a.setLink)
	api.HandleFunc("GET /api/v1/tenants/{tenant}/link", a.showLink)
	api.HandleFunc("POST /api/v1/tenants/{tenant}/link/enable", a.enableLink)
	api.HandleFunc("POST /api/v1/tenants/{tenant}/link/disable", a.disableLink)
	api.HandleFunc("POST /api/v1/tenants/{tenant}/workers", a.createWorker)
	api.HandleFunc("GET /api/v1/workers", a.listWorkers)
	api.HandleFunc("DELETE /api/v1/workers/{worker}", a.revokeWorker)
	api.HandleFunc("GET /api/v1/sessions", a.sessions)
	api.HandleFunc("PUT /api/v1/tenants/{tenant}/hetzner", a.setHetzner)
	api.HandleFunc("GET /api/v1/tenants/{tenant}/hetzner", a.showHetzner)
	api.HandleFunc("GET /api/v1/tenants/{tenant}/usage", a.usage)
	// Unknown paths answer JSON 404 too, after the token check, so the
	// API's shape is not probeable without the token.
	api.HandleFunc("/api/v1/", func(w http.ResponseWriter, r *http.Request) {
		jsonapi.WriteError(w, http.StatusNotFound, "no such admin endpoint: "+r.Method+" "+r.URL.Path)
	})
	mux.Handle("/api/v1/", a.auth.Require(api, jsonapi.WriteError))
}

func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	jsonapi.Fail(w, r, a.log, "proxy", err)
}
