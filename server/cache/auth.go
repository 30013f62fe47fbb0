package cache

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	"gradient.dev/gradient/storage"
)

// cacheKeyFromRequest takes the key from Authorization: "Bearer GRAD…",
// a bare "GRAD…", or HTTP Basic with the key as password (what a netrc
// entry makes Nix send; the user name is ignored). The GRAD prefix is
// optional everywhere.
func cacheKeyFromRequest(r *http.Request) (string, bool) {
	h := strings.TrimSpace(r.Header.Get("Authorization"))
	var token string
	switch scheme, rest, _ := strings.Cut(h, " "); {
	case h == "":
		return "", false
	case strings.EqualFold(scheme, "Bearer"):
		token = strings.TrimSpace(rest)
	case strings.EqualFold(scheme, "Basic"):
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
		if err != nil {
			return "", false
		}
		_, token, _ = strings.Cut(string(raw), ":")
	case strings.HasPrefix(h, storage.CacheKeyPrefix):
		token = h
	default:
		return "", false
	}
	token = strings.TrimPrefix(token, storage.CacheKeyPrefix)
	return token, token != ""
}

// cacheKeyAllows reports whether token is a key of cacheID: one SHA-256
// and one indexed lookup (storage.CacheKeyByToken), the same for a right
// key, a wrong one and any number of keys on the cache. A failure counts
// against the client's address.
func (c *Cache) cacheKeyAllows(r *http.Request, cacheID, token string) (bool, error) {
	_, err := c.db.CacheKeyByToken(r.Context(), cacheID, token)
	if errors.Is(err, storage.ErrNotFound) {
		c.gate.Failed(r, "cache API key")
		return false, nil
	}
	return err == nil, err
}

// plainError is http.Error in authHeldBack's answer shape.
func plainError(w http.ResponseWriter, status int, msg string) { http.Error(w, msg, status) }
