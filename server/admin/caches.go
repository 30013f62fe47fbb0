package admin

import (
	"net/http"

	"gradient.dev/gradient/storage"
)

func (a *API) createCache(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Name   string `json:"name"`
		Public bool   `json:"public"`
	}
	if err := decodeBody(w, r, &in); err != nil {
		return err
	}
	c, err := a.db.CreateCache(r.Context(), storage.NewCache{Name: in.Name, Public: in.Public})
	if err != nil {
		return err
	}
	a.log.Info("admin: cache created", "cache", c.Name, "cache_id", c.ID, "public", c.Public)
	writeJSON(w, http.StatusCreated, viewCache(c))
	return nil
}

func (a *API) listCaches(w http.ResponseWriter, r *http.Request) error {
	caches, err := a.db.ListCaches(r.Context())
	if err != nil {
		return err
	}
	views := make([]CacheView, 0, len(caches))
	for _, c := range caches {
		views = append(views, viewCache(c))
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}

func (a *API) showCache(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		return err
	}
	projects, err := a.db.CacheProjects(ctx, c.ID)
	if err != nil {
		return err
	}
	names, err := a.teamNames(ctx)
	if err != nil {
		return err
	}
	v := viewCache(c)
	for _, p := range projects {
		v.Projects = append(v.Projects, names[p.TeamID]+"/"+p.Name)
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (a *API) deleteCache(w http.ResponseWriter, r *http.Request) error {
	c, err := a.cache(r.Context(), r.PathValue("cache"))
	if err == nil {
		err = a.db.DeleteCache(r.Context(), c.ID)
	}
	if err != nil {
		return err
	}
	a.cfg.Cache.Forget(c)
	a.log.Info("admin: cache deleted", "cache", c.Name, "cache_id", c.ID)
	a.cfg.Dialer.RefreshDials() // its registrations went with it
	w.WriteHeader(http.StatusNoContent)
	return nil
}
