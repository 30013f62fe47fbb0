package server

import (
	"net/http"

	"gradient.dev/gradient/storage"
)

func (a *adminAPI) createCache(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name   string `json:"name"`
		Public bool   `json:"public"`
	}
	if err := decodeBody(w, r, &in); err != nil {
		a.fail(w, r, err)
		return
	}
	c, err := a.s.db.CreateCache(r.Context(), storage.NewCache{Name: in.Name, Public: in.Public})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.s.log.Info("admin: cache created", "cache", c.Name, "cache_id", c.ID, "public", c.Public)
	writeJSON(w, http.StatusCreated, viewCache(c))
}

func (a *adminAPI) listCaches(w http.ResponseWriter, r *http.Request) {
	caches, err := a.s.db.ListCaches(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	views := make([]cacheView, 0, len(caches))
	for _, c := range caches {
		views = append(views, viewCache(c))
	}
	writeJSON(w, http.StatusOK, views)
}

func (a *adminAPI) showCache(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	projects, err := a.s.db.CacheProjects(ctx, c.ID)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	names, err := a.teamNames(ctx)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	v := viewCache(c)
	for _, p := range projects {
		v.Projects = append(v.Projects, names[p.TeamID]+"/"+p.Name)
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *adminAPI) deleteCache(w http.ResponseWriter, r *http.Request) {
	c, err := a.cache(r.Context(), r.PathValue("cache"))
	if err == nil {
		err = a.s.db.DeleteCache(r.Context(), c.ID)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.s.cache.Forget(c)
	a.s.log.Info("admin: cache deleted", "cache", c.Name, "cache_id", c.ID)
	a.s.RefreshDials() // its registrations went with it
	w.WriteHeader(http.StatusNoContent)
}
