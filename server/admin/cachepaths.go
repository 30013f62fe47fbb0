package admin

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"gradient.dev/gradient/server/internal/pathmeta"
	"gradient.dev/gradient/storage"
)

// Admin endpoints for a cache's content (mounted by adminAPI.routes; the
// cache stores and deletes, package cache):
//
//	PUT    /api/v1/caches/{cache}/paths           NAR body + X-Nix-* headers → path
//	GET    /api/v1/caches/{cache}/paths
//	GET    /api/v1/caches/{cache}/paths/{path}     store path hash (or base name), with its narinfo
//	DELETE /api/v1/caches/{cache}/paths/{path}
//	POST   /api/v1/caches/{cache}/keys             → {id, key}; the key is shown once
//
// An upload's body is the uncompressed NAR (nix-store --dump); its
// metadata travels in headers so the body streams straight into the NAR
// store: X-Nix-Store-Path, X-Nix-Nar-Hash, X-Nix-Nar-Size, and optional
// X-Nix-References (space-separated), X-Nix-Deriver, X-Nix-CA. The hash
// and size are checked while storing; a mismatch stores nothing.

// Upload metadata headers.
const (
	HeaderStorePath  = "X-Nix-Store-Path"
	HeaderNarHash    = "X-Nix-Nar-Hash"
	HeaderNarSize    = "X-Nix-Nar-Size"
	HeaderReferences = "X-Nix-References"
	HeaderDeriver    = "X-Nix-Deriver"
	HeaderCA         = "X-Nix-CA"
)

func (a *API) cacheContentRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /api/v1/caches/{cache}/paths", a.handle(a.putCachePath))
	mux.HandleFunc("GET /api/v1/caches/{cache}/paths", a.handle(a.listCachePaths))
	mux.HandleFunc("GET /api/v1/caches/{cache}/paths/{path}", a.handle(a.showCachePath))
	mux.HandleFunc("DELETE /api/v1/caches/{cache}/paths/{path}", a.handle(a.deleteCachePath))
	mux.HandleFunc("POST /api/v1/caches/{cache}/keys", a.handle(a.createCacheKey))
}

// cachePathView is a cache path in admin answers.
type cachePathView struct {
	StorePath   string    `json:"store_path"`
	NarHash     string    `json:"nar_hash"`
	NarSize     int64     `json:"nar_size"`
	FileHash    string    `json:"file_hash"`
	FileSize    int64     `json:"file_size"`
	Compression string    `json:"compression"`
	References  []string  `json:"references"`
	Deriver     string    `json:"deriver,omitempty"`
	CA          string    `json:"ca,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	Created     *bool     `json:"created,omitempty"` // uploads only: false when already stored
	Narinfo     string    `json:"narinfo,omitempty"` // show only
}

func viewCachePath(p storage.CachePath) cachePathView {
	refs := p.References
	if refs == nil {
		refs = []string{}
	}
	return cachePathView{
		StorePath: p.StorePath, NarHash: p.NarHash, NarSize: p.NarSize,
		FileHash: p.FileHash, FileSize: p.FileSize, Compression: p.Compression,
		References: refs, Deriver: p.Deriver, CA: p.CA, CreatedAt: p.CreatedAt,
	}
}

func (a *API) putCachePath(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		return err
	}
	if !a.cfg.Cache.HasNarStore() {
		writeError(w, http.StatusServiceUnavailable, "this server has no NAR store")
		return nil
	}
	in, narHash, err := uploadMetadata(r)
	if err != nil {
		return err
	}
	if in.ExpiresAt, err = pushTTL(r); err != nil {
		return err
	}
	p, created, err := a.cfg.Cache.PushPath(ctx, c, in, narHash, r.Body)
	if err != nil {
		return err
	}
	a.answerUpload(w, p, created)
	return nil
}

func (a *API) answerUpload(w http.ResponseWriter, p storage.CachePath, created bool) {
	v := viewCachePath(p)
	v.Created = &created
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, v)
}

// uploadMetadata reads the X-Nix-* headers of an upload.
func uploadMetadata(r *http.Request) (storage.CachePath, [32]byte, error) {
	h := r.Header
	in := storage.CachePath{
		StorePath:  strings.TrimSpace(h.Get(HeaderStorePath)),
		NarHash:    strings.TrimSpace(h.Get(HeaderNarHash)),
		References: strings.Fields(h.Get(HeaderReferences)),
		Deriver:    strings.TrimSpace(h.Get(HeaderDeriver)),
		CA:         strings.TrimSpace(h.Get(HeaderCA)),
	}
	if err := pathmeta.Check(in.StorePath, in.References, in.Deriver, in.CA); err != nil {
		return in, [32]byte{}, invalidf("upload refused, nothing stored: %v", err)
	}
	narHash, err := pathmeta.ParseSHA256(in.NarHash)
	if err != nil {
		return in, narHash, invalidf("%s: %v", HeaderNarHash, err)
	}
	in.NarSize, err = strconv.ParseInt(h.Get(HeaderNarSize), 10, 64)
	if err != nil || in.NarSize <= 0 {
		return in, narHash, invalidf("%s %q is not a positive size", HeaderNarSize, h.Get(HeaderNarSize))
	}
	return in, narHash, nil
}

// cachePathHash reads the {path} segment: a hash part, base name or full path.
func cachePathHash(ref string) (string, error) {
	if len(ref) == storage.StoreHashLen {
		return ref, nil
	}
	return storage.StorePathHash(ref)
}

func (a *API) listCachePaths(w http.ResponseWriter, r *http.Request) error {
	c, err := a.cache(r.Context(), r.PathValue("cache"))
	if err != nil {
		return err
	}
	paths, err := a.db.ListCachePaths(r.Context(), c.ID)
	if err != nil {
		return err
	}
	views := make([]cachePathView, 0, len(paths))
	for _, p := range paths {
		views = append(views, viewCachePath(p))
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}

func (a *API) showCachePath(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		return err
	}
	hash, err := cachePathHash(r.PathValue("path"))
	if err != nil {
		return err
	}
	p, err := a.db.CachePath(ctx, c.ID, hash)
	if errors.Is(err, storage.ErrNotFound) {
		err = notFoundf("cache %q has no path %s", c.Name, hash)
	}
	if err != nil {
		return err
	}
	narinfo, err := a.cfg.Cache.SignedNarinfo(ctx, p)
	if err != nil {
		return err
	}
	v := viewCachePath(p)
	v.Narinfo = string(narinfo)
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (a *API) deleteCachePath(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		return err
	}
	hash, err := cachePathHash(r.PathValue("path"))
	if err != nil {
		return err
	}
	err = a.cfg.Cache.DeletePath(ctx, c, hash)
	if errors.Is(err, storage.ErrNotFound) {
		err = notFoundf("cache %q has no path %s", c.Name, hash)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) createCacheKey(w http.ResponseWriter, r *http.Request) error {
	c, err := a.cache(r.Context(), r.PathValue("cache"))
	if err != nil {
		return err
	}
	k, text, err := a.db.CreateCacheKey(r.Context(), c.ID)
	if err != nil {
		return err
	}
	a.log.Info("admin: cache key created", "cache", c.Name, "key_id", k.ID)
	writeJSON(w, http.StatusCreated, map[string]string{"id": k.ID, "cache": c.Name, "key": text})
	return nil
}
