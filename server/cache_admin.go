package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storepath"
)

// Admin endpoints for a cache's content (mounted by adminAPI.routes):
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
	headerStorePath  = "X-Nix-Store-Path"
	headerNarHash    = "X-Nix-Nar-Hash"
	headerNarSize    = "X-Nix-Nar-Size"
	headerReferences = "X-Nix-References"
	headerDeriver    = "X-Nix-Deriver"
	headerCA         = "X-Nix-CA"
)

func (a *adminAPI) cacheContentRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /api/v1/caches/{cache}/paths", a.putCachePath)
	mux.HandleFunc("GET /api/v1/caches/{cache}/paths", a.listCachePaths)
	mux.HandleFunc("GET /api/v1/caches/{cache}/paths/{path}", a.showCachePath)
	mux.HandleFunc("DELETE /api/v1/caches/{cache}/paths/{path}", a.deleteCachePath)
	mux.HandleFunc("POST /api/v1/caches/{cache}/keys", a.createCacheKey)
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

// errNarMismatch is an upload whose bytes do not match its metadata.
var errNarMismatch = errors.New("NAR does not match its metadata")

func (a *adminAPI) putCachePath(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	store := a.s.cfg.NarStore
	if store == nil {
		writeError(w, http.StatusServiceUnavailable, "this server has no NAR store")
		return
	}
	in, narHash, err := uploadMetadata(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	hash, _ := storage.StorePathHash(in.StorePath)
	if existing, err := a.s.db.CachePath(ctx, c.ID, hash); err == nil {
		// Already stored: the body need not be read (idempotent put).
		a.answerUpload(w, existing, false)
		return
	}
	var mismatch string
	obj, err := store.Put(ctx, io.LimitReader(r.Body, in.NarSize+1), func(o narstore.Object) error {
		switch {
		case o.NarSize != in.NarSize:
			mismatch = fmt.Sprintf("NAR is %d bytes, metadata says %d", o.NarSize, in.NarSize)
		case o.NarHash != narHash:
			mismatch = fmt.Sprintf("NAR hash is %s, metadata says %s", o.NarHashText(), in.NarHash)
		default:
			return nil
		}
		return errNarMismatch
	})
	if errors.Is(err, errNarMismatch) {
		a.s.metrics.cache.narUploads.WithLabelValues("mismatch").Inc()
		a.s.log.Warn("admin: NAR upload refused", "cache", c.Name, "path", in.StorePath, "reason", mismatch)
		writeError(w, http.StatusBadRequest, "upload of "+in.StorePath+" refused: "+mismatch)
		return
	}
	if err != nil {
		a.s.metrics.cache.narUploads.WithLabelValues("failed").Inc()
		a.fail(w, r, fmt.Errorf("store NAR of %s: %w", in.StorePath, err))
		return
	}
	in.CacheID = c.ID
	in.NarHash = obj.NarHashText() // normalised to sha256:<nix32>
	in.FileHash, in.FileSize = obj.FileHashText(), obj.FileSize
	in.Compression, in.ObjectKey = narstore.Compression, obj.Key
	p, created, err := a.s.db.PutCachePath(ctx, in)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.s.metrics.cache.narUploads.WithLabelValues("stored").Inc()
	a.s.log.Info("admin: path stored", "cache", c.Name, "path", p.StorePath, "nar_size", p.NarSize, "file_size", p.FileSize)
	a.answerUpload(w, p, created)
}

func (a *adminAPI) answerUpload(w http.ResponseWriter, p storage.CachePath, created bool) {
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
		StorePath:  strings.TrimSpace(h.Get(headerStorePath)),
		NarHash:    strings.TrimSpace(h.Get(headerNarHash)),
		References: strings.Fields(h.Get(headerReferences)),
		Deriver:    strings.TrimSpace(h.Get(headerDeriver)),
		CA:         strings.TrimSpace(h.Get(headerCA)),
	}
	if err := checkPathMetadata(in.StorePath, in.References, in.Deriver, in.CA); err != nil {
		return in, [32]byte{}, invalidf("upload refused, nothing stored: %v", err)
	}
	narHash, err := parseSHA256(in.NarHash)
	if err != nil {
		return in, narHash, invalidf("%s: %v", headerNarHash, err)
	}
	in.NarSize, err = strconv.ParseInt(h.Get(headerNarSize), 10, 64)
	if err != nil || in.NarSize <= 0 {
		return in, narHash, invalidf("%s %q is not a positive size", headerNarSize, h.Get(headerNarSize))
	}
	return in, narHash, nil
}

// checkPathMetadata checks what a narinfo will carry of an upload's
// metadata by Nix's rules (package storepath), before anything is stored
// or signed. Admin pushes and worker uploads both pass through it.
func checkPathMetadata(storePath string, references []string, deriver, ca string) error {
	if _, _, err := storepath.Parse(storePath); err != nil {
		return fmt.Errorf("store path: %w", err)
	}
	for _, ref := range references {
		if _, err := storepath.Base(ref); err != nil {
			return fmt.Errorf("reference: %w", err)
		}
	}
	if deriver != "" {
		if _, err := storepath.Base(deriver); err != nil {
			return fmt.Errorf("deriver: %w", err)
		}
	}
	if ca != "" {
		if err := storepath.CheckCA(ca); err != nil {
			return err
		}
	}
	return nil
}

// cachePathHash reads the {path} segment: a hash part, base name or full path.
func cachePathHash(ref string) (string, error) {
	if len(ref) == storage.StoreHashLen {
		return ref, nil
	}
	return storage.StorePathHash(ref)
}

func (a *adminAPI) listCachePaths(w http.ResponseWriter, r *http.Request) {
	c, err := a.cache(r.Context(), r.PathValue("cache"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	paths, err := a.s.db.ListCachePaths(r.Context(), c.ID)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	views := make([]cachePathView, 0, len(paths))
	for _, p := range paths {
		views = append(views, viewCachePath(p))
	}
	writeJSON(w, http.StatusOK, views)
}

func (a *adminAPI) showCachePath(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	hash, err := cachePathHash(r.PathValue("path"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	p, err := a.s.db.CachePath(ctx, c.ID, hash)
	if errors.Is(err, storage.ErrNotFound) {
		err = notFoundf("cache %q has no path %s", c.Name, hash)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	key, err := a.s.db.CacheSigningKey(ctx, c.ID)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	narinfo, err := renderNarinfo(p, key)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	v := viewCachePath(p)
	v.Narinfo = string(narinfo)
	writeJSON(w, http.StatusOK, v)
}

func (a *adminAPI) deleteCachePath(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	hash, err := cachePathHash(r.PathValue("path"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	key, inUse, err := a.s.db.DeleteCachePath(ctx, c.ID, hash)
	if errors.Is(err, storage.ErrNotFound) {
		err = notFoundf("cache %q has no path %s", c.Name, hash)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.s.cacheMemo.forgetNarinfo(c.ID, hash)
	if store := a.s.cfg.NarStore; !inUse && store != nil {
		if err := store.Delete(ctx, key); err != nil && !errors.Is(err, narstore.ErrNotFound) {
			a.s.log.Warn("admin: NAR object not deleted", "object", key, "error", err)
		}
	}
	a.s.log.Info("admin: path deleted", "cache", c.Name, "store_hash", hash)
	w.WriteHeader(http.StatusNoContent)
}

func (a *adminAPI) createCacheKey(w http.ResponseWriter, r *http.Request) {
	c, err := a.cache(r.Context(), r.PathValue("cache"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	k, text, err := a.s.db.CreateCacheKey(r.Context(), c.ID)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.s.log.Info("admin: cache key created", "cache", c.Name, "key_id", k.ID)
	writeJSON(w, http.StatusCreated, map[string]string{"id": k.ID, "cache": c.Name, "key": text})
}
