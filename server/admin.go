package server

import (
	"net/http"
	"strings"

	"gradient.dev/gradient/secret"
)

// The operator's JSON API, under /api/v1. Every request carries
// "Authorization: Bearer <admin token>". Teams and caches are named by
// name or UUID; a project is one path segment: its UUID, or TEAM/PROJECT
// with the slash escaped as %2F (in JSON bodies and query strings a plain
// TEAM/PROJECT). A worker is its UUID.
//
//	POST   /api/v1/teams                                {name}
//	GET    /api/v1/teams
//	GET    /api/v1/teams/{team}
//	DELETE /api/v1/teams/{team}
//	POST   /api/v1/teams/{team}/workers                 {worker_id?, url?, fetch?, eval?, build?} → token, once
//	GET    /api/v1/teams/{team}/workers
//	DELETE /api/v1/teams/{team}/workers/{worker}
//
//	POST   /api/v1/projects                             {team, name, repository, branch?, wildcards?}
//	GET    /api/v1/projects                             ?team=TEAM to filter
//	GET    /api/v1/projects/{project}                   with its caches and granted teams
//	PATCH  /api/v1/projects/{project}                   {wildcards}: what later evaluations build
//	DELETE /api/v1/projects/{project}
//	PUT    /api/v1/projects/{project}/caches/{cache}    subscribe (reauths the project's workers)
//	DELETE /api/v1/projects/{project}/caches/{cache}    unsubscribe
//	PUT    /api/v1/projects/{project}/teams/{team}      grant the team's workers (reauths them)
//	DELETE /api/v1/projects/{project}/teams/{team}      revoke
//	GET    /api/v1/projects/{project}/workers           live state of the project's workers
//	POST   /api/v1/projects/{project}/deploy-key        generate an SSH deploy key (replaces one) → public key
//	DELETE /api/v1/projects/{project}/deploy-key
//
//	POST   /api/v1/caches                               {name, public?}
//	GET    /api/v1/caches
//	GET    /api/v1/caches/{cache}                       with public_key for trusted-public-keys
//	DELETE /api/v1/caches/{cache}
//	PUT    /api/v1/caches/{cache}/paths                 NAR body + X-Nix-* headers (cache_admin.go)
//	GET    /api/v1/caches/{cache}/paths
//	GET    /api/v1/caches/{cache}/paths/{path}          with its signed narinfo
//	DELETE /api/v1/caches/{cache}/paths/{path}
//	POST   /api/v1/caches/{cache}/keys                  private-cache API key → key, once
//
//	POST   /api/v1/registrations                        {peer_kind, peer, worker_id?, url?, fetch?, eval?, build?} → token, once
//	GET    /api/v1/registrations?peer_kind=K&peer=P
//	DELETE /api/v1/registrations/{peer_kind}/{peer}/{worker}
//
//	GET    /api/v1/workers/{worker}                     live state, registrations, deactivation
//	POST   /api/v1/workers/{worker}/deactivate
//	POST   /api/v1/workers/{worker}/activate
//
//	GET    /api/v1/server                               accepting, connected workers
//	POST   /api/v1/server/stop-accepting
//	POST   /api/v1/server/resume-accepting
//
// Errors are {"error": "sentence"}: 400 invalid input, 401 wrong or
// missing token, 404 unknown record, 409 conflict, 429 too many wrong
// tokens from the address (Retry-After), 503 API disabled.

// adminAPI serves the admin endpoints of one Server.
type adminAPI struct {
	s *Server
	// tokens checks the admin token: each argon2id check takes ~19 MiB,
	// so at most a few run at once, and the token that matched is
	// remembered, so the operator's requests skip the queue that wrong
	// tokens wait in (those are also limited per address, authHeldBack).
	tokens *secret.Verifier
}

// adminVerifyConcurrency is how many admin token checks run at once.
const adminVerifyConcurrency = 4

// mountAdminAPI mounts the operator's JSON API under /api/v1.
func (s *Server) mountAdminAPI(mux *http.ServeMux) {
	a := &adminAPI{s: s, tokens: secret.NewVerifier(adminVerifyConcurrency)}
	a.tokens.Observe = s.metrics.argon2Checked
	api := http.NewServeMux()
	a.routes(api)
	// Unknown paths under /api/v1/ answer JSON 404 too, after the token
	// check, so the API's shape is not probeable without the token.
	api.HandleFunc("/api/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such admin endpoint: "+r.Method+" "+r.URL.Path)
	})
	mux.Handle("/api/v1/", a.requireAdmin(api))
}

func (a *adminAPI) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/teams", a.createTeam)
	mux.HandleFunc("GET /api/v1/teams", a.listTeams)
	mux.HandleFunc("GET /api/v1/teams/{team}", a.showTeam)
	mux.HandleFunc("DELETE /api/v1/teams/{team}", a.deleteTeam)
	mux.HandleFunc("POST /api/v1/teams/{team}/workers", a.createTeamWorker)
	mux.HandleFunc("GET /api/v1/teams/{team}/workers", a.listTeamWorkers)
	mux.HandleFunc("DELETE /api/v1/teams/{team}/workers/{worker}", a.deleteTeamWorker)

	mux.HandleFunc("POST /api/v1/projects", a.createProject)
	mux.HandleFunc("GET /api/v1/projects", a.listProjects)
	mux.HandleFunc("GET /api/v1/projects/{project}", a.showProject)
	mux.HandleFunc("PATCH /api/v1/projects/{project}", a.updateProject)
	mux.HandleFunc("DELETE /api/v1/projects/{project}", a.deleteProject)
	mux.HandleFunc("PUT /api/v1/projects/{project}/caches/{cache}", a.subscribe)
	mux.HandleFunc("DELETE /api/v1/projects/{project}/caches/{cache}", a.unsubscribe)
	mux.HandleFunc("PUT /api/v1/projects/{project}/teams/{team}", a.grant)
	mux.HandleFunc("DELETE /api/v1/projects/{project}/teams/{team}", a.revoke)
	mux.HandleFunc("GET /api/v1/projects/{project}/workers", a.projectWorkers)
	mux.HandleFunc("POST /api/v1/projects/{project}/deploy-key", a.generateDeployKey)
	mux.HandleFunc("DELETE /api/v1/projects/{project}/deploy-key", a.deleteDeployKey)
	a.evaluationRoutes(mux) // evaluations and builds: admin_evaluations.go

	mux.HandleFunc("POST /api/v1/caches", a.createCache)
	mux.HandleFunc("GET /api/v1/caches", a.listCaches)
	mux.HandleFunc("GET /api/v1/caches/{cache}", a.showCache)
	mux.HandleFunc("DELETE /api/v1/caches/{cache}", a.deleteCache)
	a.cacheContentRoutes(mux) // paths and keys: cache_admin.go

	mux.HandleFunc("POST /api/v1/registrations", a.createRegistration)
	mux.HandleFunc("GET /api/v1/registrations", a.listRegistrations)
	mux.HandleFunc("DELETE /api/v1/registrations/{kind}/{peer}/{worker}", a.deleteRegistration)

	mux.HandleFunc("GET /api/v1/workers/{worker}", a.showWorker)
	mux.HandleFunc("POST /api/v1/workers/{worker}/deactivate", a.deactivateWorker)
	mux.HandleFunc("POST /api/v1/workers/{worker}/activate", a.activateWorker)

	mux.HandleFunc("GET /api/v1/server", a.serverState)
	mux.HandleFunc("POST /api/v1/server/stop-accepting", a.stopAccepting)
	mux.HandleFunc("POST /api/v1/server/resume-accepting", a.resumeAccepting)
}

// requireAdmin lets a request through only with the admin bearer token.
func (a *adminAPI) requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hash := a.s.cfg.AdminTokenHash
		if hash == "" {
			writeError(w, http.StatusServiceUnavailable, "admin API disabled: set an admin token")
			return
		}
		token, ok := bearerToken(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gradient-admin"`)
			writeError(w, http.StatusUnauthorized, "missing admin token: send Authorization: Bearer <admin token>")
			return
		}
		if a.s.gate.HeldBack(w, r, writeError) {
			return
		}
		if !a.tokens.Verify(hash, token) { // constant time
			a.s.gate.Failed(r, "admin token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="gradient-admin", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, "wrong admin token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
