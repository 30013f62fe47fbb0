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
	out, err := a.Sessions(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	jsonapi.Write(w, http.StatusOK, out)
}
