package admin

import (
	"context"
	"gradient.dev/gradient/server/adminapi"
	"net/http"
	"strconv"
	"time"
)

// Retention and garbage collection (README "Retention and garbage
// collection"):
//
//	POST   /api/v1/gc[?dry_run=true]              run a collection → adminapi.GCReport
//	PUT    /api/v1/evaluations/{id}/pin           keep an evaluation whatever its age
//	DELETE /api/v1/evaluations/{id}/pin
//	GET|PUT /api/v1/projects/{project}/retention  {"keep_evaluations": N or null}
//	GET|PUT /api/v1/caches/{cache}/retention      {"max_bytes": N or null}

// Collector runs garbage collections of the binary cache.
type Collector interface {
	Run(ctx context.Context, dryRun bool) (adminapi.GCReport, error)
}

// HeaderTTL is a push's optional time to live in seconds: the pushed
// path is a collection root until then.
const HeaderTTL = "X-Gradient-TTL"

func (a *API) retentionRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/gc", a.handle(a.collect))
	mux.HandleFunc("PUT /api/v1/evaluations/{id}/pin", a.pin(true))
	mux.HandleFunc("DELETE /api/v1/evaluations/{id}/pin", a.pin(false))
	mux.HandleFunc("GET /api/v1/projects/{project}/retention", a.handle(a.projectRetention))
	mux.HandleFunc("PUT /api/v1/projects/{project}/retention", a.handle(a.projectRetention))
	mux.HandleFunc("GET /api/v1/caches/{cache}/retention", a.handle(a.cacheRetention))
	mux.HandleFunc("PUT /api/v1/caches/{cache}/retention", a.handle(a.cacheRetention))
}

func (a *API) collect(w http.ResponseWriter, r *http.Request) error {
	if a.cfg.Collector == nil {
		writeError(w, http.StatusServiceUnavailable, "this server does not collect garbage")
		return nil
	}
	dry, _ := strconv.ParseBool(r.URL.Query().Get("dry_run"))
	rep, err := a.cfg.Collector.Run(r.Context(), dry)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}

// PinView is an evaluation's pin.
type PinView struct {
	EvaluationID string `json:"evaluation_id"`
	Pinned       bool   `json:"pinned"`
}

func (a *API) pin(pinned bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := a.db.SetEvaluationPinned(r.Context(), id, pinned); err != nil {
			a.fail(w, r, err)
			return
		}
		a.log.Info("admin: evaluation pin changed", "evaluation_id", id, "pinned", pinned)
		writeJSON(w, http.StatusOK, PinView{EvaluationID: id, Pinned: pinned})
	}
}

// ProjectRetentionView is a project's retention setting; null: the
// server's default.
type ProjectRetentionView struct {
	ProjectID       string `json:"project_id"`
	KeepEvaluations *int   `json:"keep_evaluations"`
}

func (a *API) projectRetention(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p, err := a.project(ctx, r.PathValue("project"))
	if err == nil && r.Method == http.MethodPut {
		var in ProjectRetentionView
		if err = decodeBody(w, r, &in); err == nil {
			err = a.db.SetProjectKeepEvaluations(ctx, p.ID, in.KeepEvaluations)
		}
		if err == nil {
			a.log.Info("admin: project retention changed", "project_id", p.ID, "keep_evaluations", in.KeepEvaluations)
		}
	}
	var keep *int
	if err == nil {
		keep, err = a.db.ProjectKeepEvaluations(ctx, p.ID)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ProjectRetentionView{ProjectID: p.ID, KeepEvaluations: keep})
	return nil
}

// CacheRetentionView is a cache's size cap; null: none.
type CacheRetentionView struct {
	CacheID  string `json:"cache_id"`
	MaxBytes *int64 `json:"max_bytes"`
}

func (a *API) cacheRetention(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err == nil && r.Method == http.MethodPut {
		var in CacheRetentionView
		if err = decodeBody(w, r, &in); err == nil {
			err = a.db.SetCacheMaxBytes(ctx, c.ID, in.MaxBytes)
		}
		if err == nil {
			a.log.Info("admin: cache size cap changed", "cache", c.Name, "max_bytes", in.MaxBytes)
		}
	}
	var max *int64
	if err == nil {
		max, err = a.db.CacheMaxBytes(ctx, c.ID)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, CacheRetentionView{CacheID: c.ID, MaxBytes: max})
	return nil
}

// pushTTL reads the optional X-Gradient-TTL of a push.
func pushTTL(r *http.Request) (time.Time, error) {
	v := r.Header.Get(HeaderTTL)
	if v == "" {
		return time.Time{}, nil
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil || secs <= 0 {
		return time.Time{}, invalidf("%s must be a positive number of seconds", HeaderTTL)
	}
	return time.Now().Add(time.Duration(secs) * time.Second), nil
}
