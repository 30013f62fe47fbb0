package server

import (
	"encoding/base64"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"

	"gradient.dev/gradient/authority"
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
func (s *Server) cacheKeyAllows(r *http.Request, cacheID, token string) (bool, error) {
	_, err := s.db.CacheKeyByToken(r.Context(), cacheID, token)
	if errors.Is(err, storage.ErrNotFound) {
		s.authFailed(r, "cache API key")
		return false, nil
	}
	return err == nil, err
}

// authHeldBack answers 429 when the request's address has no failed
// authentications left (Config.AuthFailuresPerMinute); true when it did.
// Callers ask before checking a presented credential, so a held-back
// address costs no check at all; requests without credentials are not
// asked about.
func (s *Server) authHeldBack(w http.ResponseWriter, r *http.Request, answer func(w http.ResponseWriter, status int, msg string)) bool {
	if s.authFailures == nil {
		return false
	}
	wait, blocked := s.authFailures.Blocked(authority.ClientIP(r))
	if !blocked {
		return false
	}
	seconds := strconv.Itoa(int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", seconds)
	answer(w, http.StatusTooManyRequests, "too many failed authentications from this address: retry in "+seconds+" s")
	return true
}

// authFailed records a wrong credential of the request's address.
func (s *Server) authFailed(r *http.Request, what string) {
	if s.authFailures == nil {
		return
	}
	ip := authority.ClientIP(r)
	s.authFailures.Fail(ip)
	if _, blocked := s.authFailures.Blocked(ip); blocked {
		s.log.Warn("failed authentications: address held back", "remote", ip, "credential", what)
	}
}

// plainError is http.Error in authHeldBack's answer shape.
func plainError(w http.ResponseWriter, status int, msg string) { http.Error(w, msg, status) }
