package admin

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/storage"
)

// Scoped API tokens, public projects and the restart of failed builds
// (mounted by routes in admin.go):
//
//	POST   /api/v1/tokens                               {name, scope: read|admin} → token, once
//	GET    /api/v1/tokens
//	DELETE /api/v1/tokens/{id}                          revoke (ends its dashboard sessions)
//	PUT    /api/v1/projects/{project}/public            evaluations, builds, logs readable by anyone
//	DELETE /api/v1/projects/{project}/public
//	POST   /api/v1/evaluations/{id}/restart-failed      → {evaluation, restarted}
//
// A scoped token (storage.APITokenPrefix…) is accepted wherever the
// admin token is: an admin-scoped one for everything, a read-scoped one
// for GET only (403 otherwise).

func (a *API) accessRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/tokens", a.handle(a.createToken))
	mux.HandleFunc("GET /api/v1/tokens", a.handle(a.listTokens))
	mux.HandleFunc("DELETE /api/v1/tokens/{id}", a.handle(a.deleteToken))
	mux.HandleFunc("PUT /api/v1/projects/{project}/public", a.setPublic(true))
	mux.HandleFunc("DELETE /api/v1/projects/{project}/public", a.setPublic(false))
	mux.HandleFunc("POST /api/v1/evaluations/{id}/restart-failed", a.handle(a.restartFailed))
}

// TokenView is a scoped API token; Token is set once, when created.
type TokenView struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Scope     string    `json:"scope"`
	CreatedAt time.Time `json:"created_at"`
	Token     string    `json:"token,omitempty"`
}

func viewToken(t storage.APIToken) TokenView {
	return TokenView{ID: t.ID, Name: t.Name, Scope: string(t.Scope), CreatedAt: t.CreatedAt}
}

func (a *API) createToken(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Name  string `json:"name"`
		Scope string `json:"scope"`
	}
	if err := decodeBody(w, r, &in); err != nil {
		return err
	}
	t, text, err := a.db.CreateAPIToken(r.Context(), in.Name, storage.TokenScope(in.Scope))
	if err != nil {
		return err
	}
	a.log.Info("admin: API token created", "token_id", t.ID, "name", t.Name, "scope", t.Scope)
	v := viewToken(t)
	v.Token = text
	writeJSON(w, http.StatusCreated, v)
	return nil
}

func (a *API) listTokens(w http.ResponseWriter, r *http.Request) error {
	tokens, err := a.db.APITokens(r.Context())
	if err != nil {
		return err
	}
	views := make([]TokenView, 0, len(tokens))
	for _, t := range tokens {
		views = append(views, viewToken(t))
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}

func (a *API) deleteToken(w http.ResponseWriter, r *http.Request) error {
	if err := a.db.DeleteAPIToken(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	a.log.Info("admin: API token revoked", "token_id", r.PathValue("id"))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// PublicView is a project's public flag.
type PublicView struct {
	ProjectID string `json:"project_id"`
	Public    bool   `json:"public"`
}

func (a *API) setPublic(public bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := a.project(r.Context(), r.PathValue("project"))
		if err == nil {
			err = a.db.SetProjectPublic(r.Context(), p.ID, public)
		}
		if err != nil {
			a.fail(w, r, err)
			return
		}
		a.log.Info("admin: project visibility changed", "project_id", p.ID, "public", public)
		writeJSON(w, http.StatusOK, PublicView{ProjectID: p.ID, Public: public})
	}
}

// FailedBuildRestarter restarts an evaluation's failed builds (the
// scheduler implements it beside Evaluations).
type FailedBuildRestarter interface {
	RestartFailedBuilds(ctx context.Context, evalID string) (int, error)
}

// RestartView is the answer of restart-failed.
type RestartView struct {
	Evaluation EvaluationView `json:"evaluation"`
	Restarted  int            `json:"restarted"`
}

func (a *API) restartFailed(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	e, err := a.queue.Evaluation(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	ctl, ok := a.cfg.Evaluations.(FailedBuildRestarter)
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "no job loop: this server cannot restart builds")
		return nil
	}
	n, err := ctl.RestartFailedBuilds(ctx, e.ID)
	if err == nil {
		e, err = a.queue.Evaluation(ctx, e.ID)
	}
	if err != nil {
		return err
	}
	a.log.Info("admin: failed builds restarted", "evaluation", e.ID, "builds", n)
	writeJSON(w, http.StatusOK, RestartView{Evaluation: viewEvaluation(e, a.projectNameByID(ctx, e.ProjectID)), Restarted: n})
	return nil
}

// Access is what a presented token may do.
type Access struct {
	Scope   storage.TokenScope
	TokenID string // "" for the admin token
}

// ErrWrongToken is a token that is neither the admin token nor a scoped
// API token.
var ErrWrongToken = errors.New("wrong token")

// CheckToken tells what token grants: the admin token (checked in
// constant time through the API's verifier) or a scoped API token (by
// its SHA-256). The caller counts failures (authgate). ErrWrongToken
// when it grants nothing; other errors are the database's.
func (a *API) CheckToken(ctx context.Context, token string) (Access, error) {
	if strings.HasPrefix(token, storage.APITokenPrefix) {
		t, err := a.db.APITokenByText(ctx, token)
		if errors.Is(err, storage.ErrNotFound) {
			return Access{}, ErrWrongToken
		}
		if err != nil {
			return Access{}, err
		}
		return Access{Scope: t.Scope, TokenID: t.ID}, nil
	}
	if a.cfg.AdminTokenHash != "" && a.tokens.Verify(a.cfg.AdminTokenHash, token) {
		return Access{Scope: storage.ScopeAdmin}, nil
	}
	return Access{}, ErrWrongToken
}

// requireScoped lets requests with a scoped API token through by its
// scope and hands every other request to admin (the admin token check).
func (a *API) requireScoped(admin, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := authgate.BearerToken(r)
		if !ok || !strings.HasPrefix(token, storage.APITokenPrefix) {
			admin.ServeHTTP(w, r)
			return
		}
		if a.cfg.Gate.HeldBack(w, r, writeError) {
			return
		}
		access, err := a.CheckToken(r.Context(), token)
		if errors.Is(err, ErrWrongToken) {
			a.cfg.Gate.Failed(r, "API token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="gradient-admin", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, "wrong or revoked API token")
			return
		}
		if err != nil {
			a.fail(w, r, err)
			return
		}
		if !access.Allows(r.Method) {
			writeError(w, http.StatusForbidden, "this API token may only read (GET)")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Allows reports whether the access may make a request with method.
func (acc Access) Allows(method string) bool {
	return acc.Scope == storage.ScopeAdmin || method == http.MethodGet || method == http.MethodHead
}

// Internal serves the API's endpoints without any token check, for a
// client in the same process that authenticated the request itself (the
// dashboard, after its session, scope and CSRF checks): one API, two
// clients.
func (a *API) Internal() http.Handler {
	a.internalOnce.Do(func() {
		a.internal = http.NewServeMux()
		a.routes(a.internal)
	})
	return a.internal
}

// EvaluationOf is an evaluation as the API shows it (project as
// TEAM/PROJECT), for the dashboard's pages.
func EvaluationOf(e storage.Evaluation, project string) EvaluationView {
	return viewEvaluation(e, project)
}

// BuildOf is a build as the API shows it, with its live progress.
func (a *API) BuildOf(b storage.Build) BuildView { return a.viewBuildNow(b) }

// CacheOf is a cache as the API shows it.
func CacheOf(c storage.Cache) CacheView { return viewCache(c) }

// BuildOutputView is an output of a build as the API shows it.
type BuildOutputView = buildOutputView
