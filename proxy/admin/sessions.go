package admin

import (
	"net/http"

	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/proxy/upstream"
)

// sessionsView is every session of both legs right now.
type sessionsView struct {
	// Upstream are the sessions the proxy runs to tenants' servers
	// (live, or dialing with the worker's backoff).
	Upstream []upstream.Status `json:"upstream"`
	// Downstream are the live sessions of the proxy's own workers.
	Downstream []downstreamSession `json:"downstream"`
}

func (a *API) sessions(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	out := sessionsView{Upstream: a.cfg.Upstream.Statuses(), Downstream: []downstreamSession{}}
	for i := range out.Upstream {
		if out.Upstream[i].Peers == nil {
			out.Upstream[i].Peers = []string{}
		}
	}
	tenants, err := a.store.Tenants(ctx)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	for _, t := range tenants {
		workers, err := a.store.Workers(ctx, t.ID)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		for _, wk := range workers {
			if st := a.cfg.Downstream.WorkerStatus(wk.ID); st.Live {
				out.Downstream = append(out.Downstream, downstreamSession{WorkerID: wk.ID, Name: wk.Name, Tenant: t.Name,
					ConnectedAt: st.ConnectedAt, Capabilities: st.Capabilities, Draining: st.Draining})
			}
		}
	}
	jsonapi.Write(w, http.StatusOK, out)
}
