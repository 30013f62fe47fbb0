package cache

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/storage"
)

// The plain Nix binary cache (docs/protocol/cache.md §9), one per cache:
//
//	GET|HEAD /cache/{cache}/nix-cache-info
//	GET|HEAD /cache/{cache}/{hash}.narinfo
//	GET|HEAD /cache/{cache}/nar/{file hash}.nar.zst
//
// Unknown caches, paths and objects answer 404, which Nix reads as "not
// here". A private cache wants a cache API key (auth.go): missing
// or wrong → 401; an address with too many wrong keys → 429.

// binaryCachePriority is announced in nix-cache-info: the reference's
// default 10 (docs/protocol/cache.md §9), below cache.nixos.org's 40, so Nix asks the
// CI's own cache first.
const binaryCachePriority = 10

// Mount mounts /cache/{cache}/… on mux.
func (bc *Cache) Mount(mux *http.ServeMux) {
	// GET patterns also match HEAD.
	mux.HandleFunc("GET /cache/{cache}/nix-cache-info", bc.serveCacheInfo)
	mux.HandleFunc("GET /cache/{cache}/{file}", bc.serveNarinfo)
	mux.HandleFunc("GET /cache/{cache}/nar/{file}", bc.serveNar)
	mux.HandleFunc("GET /cache/{cache}/proto", bc.serveSession)
}

// open resolves the cache named in the URL and checks the caller may read
// it. On false the answer has been written.
func (bc *Cache) open(w http.ResponseWriter, r *http.Request) (storage.Cache, bool) {
	c, err := bc.cacheMemo.cacheByName(r.Context(), bc.db, r.PathValue("cache"))
	if errors.Is(err, storage.ErrNotFound) {
		http.Error(w, "no such cache", http.StatusNotFound)
		return c, false
	}
	if err != nil {
		bc.internal(w, r, err)
		return c, false
	}
	if c.Public {
		return c, true
	}
	token, ok := cacheKeyFromRequest(r)
	if ok {
		if bc.gate.HeldBack(w, r, plainError) {
			return c, false
		}
		allowed, err := bc.cacheKeyAllows(r, c.ID, token)
		if err != nil {
			bc.internal(w, r, err)
			return c, false
		}
		if allowed {
			return c, true
		}
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="gradient cache `+c.Name+`"`)
	http.Error(w, "this cache is private: send a cache API key", http.StatusUnauthorized)
	return c, false
}

func (bc *Cache) internal(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return // the client left
	}
	bc.log.Error("binary cache request failed", "path", r.URL.Path, "error", err)
	http.Error(w, "internal error", http.StatusInternalServerError)
}

func (bc *Cache) serveCacheInfo(w http.ResponseWriter, r *http.Request) {
	if _, ok := bc.open(w, r); !ok {
		return
	}
	body := "StoreDir: " + storage.StoreDir + "\nWantMassQuery: 1\nPriority: " + strconv.Itoa(binaryCachePriority) + "\n"
	writeText(w, r, "text/x-nix-cache-info", []byte(body))
}

func (bc *Cache) serveNarinfo(w http.ResponseWriter, r *http.Request) {
	hash, ok := strings.CutSuffix(r.PathValue("file"), ".narinfo")
	if !ok {
		http.NotFound(w, r)
		return
	}
	// Narinfos may be read by web pages of any origin (docs/protocol/cache.md §9).
	w.Header().Set("Access-Control-Allow-Origin", "*")
	c, ok := bc.open(w, r)
	if !ok {
		return
	}
	body, stamp, ok := bc.cacheMemo.narinfo(c.ID, hash)
	if !ok {
		p, err := bc.db.CachePath(r.Context(), c.ID, hash)
		if errors.Is(err, storage.ErrNotFound) {
			bc.metrics.narinfos.WithLabelValues(cacheLabel(c), "miss").Inc()
			http.NotFound(w, r)
			return
		}
		if err != nil {
			bc.internal(w, r, err)
			return
		}
		key, err := bc.cacheMemo.signingKey(r.Context(), bc.db, c.ID)
		if err != nil {
			bc.internal(w, r, err)
			return
		}
		if body, err = renderNarinfo(p, key); err != nil {
			bc.internal(w, r, err)
			return
		}
		bc.cacheMemo.storeNarinfo(c.ID, hash, body, stamp)
	}
	bc.metrics.narinfos.WithLabelValues(cacheLabel(c), "hit").Inc()
	bc.served.note(c.ID, hash, time.Now())
	w.Header().Set("X-Cache", "HIT")
	writeText(w, r, "text/x-nix-narinfo", body)
}

func (bc *Cache) serveNar(w http.ResponseWriter, r *http.Request) {
	// nar/<key>.nar.zst; any .nar or .nar.* name maps to the same key.
	key, _, _ := strings.Cut(r.PathValue("file"), ".")
	c, ok := bc.open(w, r)
	if !ok {
		return
	}
	// Only objects of this cache's paths: a private cache's NARs must not
	// be reachable through another cache.
	p, err := bc.db.CachePathByObject(r.Context(), c.ID, key)
	if errors.Is(err, storage.ErrNotFound) {
		http.NotFound(w, r)
		return
	}
	if err != nil {
		bc.internal(w, r, err)
		return
	}
	store := bc.cfg.NarStore
	if store == nil {
		http.Error(w, "this server has no NAR store", http.StatusServiceUnavailable)
		return
	}
	if ps := bc.presigner; ps != nil && !bc.cfg.Presign.StreamNars {
		// The bytes go from the store to the client; Nix follows the
		// redirect. The URL names the object only, valid 1 h.
		url, err := ps.PresignGet(r.Context(), key)
		if err != nil {
			bc.internal(w, r, err)
			return
		}
		bc.metrics.narRedirects.WithLabelValues(cacheLabel(c)).Inc()
		w.Header().Set("Cache-Control", "no-store") // the URL expires
		http.Redirect(w, r, url, http.StatusFound)
		return
	}
	obj, size, err := store.Open(r.Context(), key)
	if errors.Is(err, narstore.ErrNotFound) {
		bc.log.Warn("binary cache: object of a recorded path is missing", "cache", c.Name, "path", p.StorePath, "object", key)
		http.NotFound(w, r)
		return
	}
	if err != nil {
		bc.internal(w, r, err)
		return
	}
	defer obj.Close()
	w.Header().Set("Content-Type", "application/x-nix-nar")
	started := time.Now()
	sent := &countingWriter{ResponseWriter: w}
	if seeker, ok := obj.(io.ReadSeeker); ok {
		// The object is the served file itself (stored compressed as
		// served), so ranges are byte ranges of it: a resumed download
		// gets 206 with Content-Range, an unsatisfiable range 416. The
		// key is the file's hash, so it is a strong ETag for If-Range.
		w.Header().Set("ETag", `"`+key+`"`)
		http.ServeContent(sent, r, "", time.Time{}, seeker)
	} else {
		// A store without seekable objects streams the whole body.
		w.Header().Set("Accept-Ranges", "none")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, err = io.Copy(sent, obj)
		}
	}
	if sent.n == 0 { // HEAD, 304, 416
		return
	}
	label := cacheLabel(c)
	bc.metrics.narBytes.WithLabelValues(label).Add(float64(sent.n))
	bc.metrics.narDownloads.WithLabelValues(label).Inc()
	bc.metrics.narSeconds.WithLabelValues(label).Observe(time.Since(started).Seconds())
	bc.metrics.narSizes.WithLabelValues(label).Observe(float64(sent.n))
	bc.log.Debug("binary cache: NAR sent", "cache", c.Name, "path", p.StorePath, "bytes", sent.n, "range", r.Header.Get("Range"), "error", err)
}

// countingWriter counts the body bytes of a response. ReadFrom keeps the
// connection's sendfile path for a file body.
type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countingWriter) ReadFrom(src io.Reader) (int64, error) {
	n, err := io.Copy(c.ResponseWriter, src)
	c.n += n
	return n, err
}

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// writeText answers a small text document (HEAD gets the headers only).
func writeText(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
}
