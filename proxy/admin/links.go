package admin

import (
	"net/http"
	"time"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/internal/dialguard"
	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb"
)

// linkView is a tenant's upstream link: never its tokens, only the IDs
// of the peers they belong to.
type linkView struct {
	Tenant       string   `json:"tenant"`
	TenantID     string   `json:"tenant_id"`
	TenantMayRun bool     `json:"tenant_may_run"`
	URL          string   `json:"url"`
	WorkerID     string   `json:"worker_id"`
	Peers        []string `json:"peers"`
	Enabled      bool     `json:"enabled"`
	// State is "ok" or "failing" (the tenant's server rejected the
	// proxy's credentials; no session starts until the link is set
	// again); Reason is the server's, Since when the state began.
	State     proxystore.LinkState `json:"state"`
	Reason    string               `json:"reason"`
	Since     time.Time            `json:"since"`
	UpdatedAt time.Time            `json:"updated_at"`
	// Connects: enabled, the tenant may run and the link is not failing,
	// so the proxy holds a session for it.
	Connects bool        `json:"connects"`
	Session  sessionView `json:"session"`
}

// sessionView is the upstream session of a link right now.
type sessionView struct {
	// Active: the proxy runs the session (live, or dialing with the
	// worker's backoff); false for a link that does not connect, or
	// until the upstream leg has read a change (at once after the API's
	// own writes).
	Active      bool      `json:"active"`
	Live        bool      `json:"live"`
	ConnectedAt time.Time `json:"connected_at,omitzero"`
}

func (a *API) linkView(l proxystore.Link) linkView {
	v := linkView{Tenant: l.TenantName, TenantID: l.TenantID, TenantMayRun: l.TenantMayRun, URL: l.URL, WorkerID: l.WorkerID,
		Peers: l.Peers, Enabled: l.Enabled, State: l.State, Reason: l.FailureReason, Since: l.StateSince,
		UpdatedAt: l.UpdatedAt, Connects: l.Connects()}
	if v.Peers == nil {
		v.Peers = []string{}
	}
	if st, ok := a.cfg.Upstream.Status(l.TenantID); ok {
		v.Session = sessionView{Active: true, Live: st.Live, ConnectedAt: st.ConnectedAt}
	}
	return v
}

// setLink sets the tenant's link from the peers-file text the tenant
// handed over; a failing link set again connects again.
func (a *API) setLink(w http.ResponseWriter, r *http.Request) {
	var in struct {
		URL      string `json:"url"`
		WorkerID string `json:"worker_id"`
		Peers    string `json:"peers"`
	}
	if err := jsonapi.Decode(w, r, &in); err != nil {
		a.fail(w, r, err)
		return
	}
	var err error
	switch {
	case in.URL == "":
		err = sqldb.Invalid("url is required: the tenant server's ws:// or wss:// /proto URL")
	case in.WorkerID == "":
		err = sqldb.Invalid("worker_id is required: the proxy's worker ID registered on the tenant's server")
	case in.Peers == "":
		err = sqldb.Invalid("peers is required: the text of the peers file (PEER_ID:TOKEN lines) the tenant handed over")
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if !a.cfg.AllowLinkLocalLinks {
		if err := dialguard.CheckURL(in.URL); err != nil {
			a.fail(w, r, sqldb.Invalid("url: %v (cloud metadata services answer there); the proxy's --allow-link-local-links allows it", err))
			return
		}
	}
	peers, err := proxystore.ParsePeersFile(in.Peers)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	l, err := a.store.SetLink(r.Context(), r.PathValue("tenant"), in.URL, in.WorkerID, peers)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.cfg.Upstream.Changed()
	a.log.Info("admin: upstream link set", "tenant", l.TenantName, "server", gitsource.Redact(l.URL),
		"worker_id", l.WorkerID, "peers", l.Peers, "enabled", l.Enabled)
	jsonapi.Write(w, http.StatusOK, a.linkView(l))
}

func (a *API) showLink(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	t, err := a.store.Tenant(ctx, r.PathValue("tenant"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	l, err := a.store.Link(ctx, t.ID)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	jsonapi.Write(w, http.StatusOK, a.linkView(l))
}

func (a *API) enableLink(w http.ResponseWriter, r *http.Request)  { a.switchLink(w, r, true) }
func (a *API) disableLink(w http.ResponseWriter, r *http.Request) { a.switchLink(w, r, false) }

func (a *API) switchLink(w http.ResponseWriter, r *http.Request, on bool) {
	ctx := r.Context()
	t, err := a.store.Tenant(ctx, r.PathValue("tenant"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	var l proxystore.Link
	if on {
		l, err = a.store.EnableLink(ctx, t.ID)
	} else {
		l, err = a.store.DisableLink(ctx, t.ID)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.cfg.Upstream.Changed()
	a.log.Info("admin: upstream link switched", "tenant", l.TenantName, "enabled", l.Enabled)
	jsonapi.Write(w, http.StatusOK, a.linkView(l))
}
