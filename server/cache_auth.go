package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage"
)

// cacheKeyTTL is how long a verified cache API key is trusted without a
// new argon2id check: Nix sends one request per narinfo and NAR, and each
// check costs ~30 ms and 19 MiB. A deleted key keeps working this long.
const cacheKeyTTL = time.Minute

// cacheKeyVerifier checks cache API keys against their stored hashes and
// remembers keys that matched.
type cacheKeyVerifier struct {
	db    *storage.DB
	slots chan struct{} // bounds concurrent argon2id checks

	mu       sync.Mutex
	verified map[[32]byte]verifiedKey // SHA-256 of cache ID + token
}

type verifiedKey struct{ until time.Time }

func newCacheKeyVerifier(db *storage.DB) *cacheKeyVerifier {
	return &cacheKeyVerifier{db: db, slots: make(chan struct{}, adminVerifyConcurrency), verified: map[[32]byte]verifiedKey{}}
}

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

// allows reports whether token is a key of cacheID.
func (v *cacheKeyVerifier) allows(ctx context.Context, cacheID, token string) (bool, error) {
	id := sha256.Sum256([]byte(cacheID + "\x00" + token))
	now := time.Now()
	v.mu.Lock()
	hit, ok := v.verified[id]
	v.mu.Unlock()
	if ok && now.Before(hit.until) {
		return true, nil
	}
	keys, err := v.db.CacheKeys(ctx, cacheID)
	if err != nil {
		return false, err
	}
	select {
	case v.slots <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-v.slots }()
	for _, k := range keys {
		if secret.Verify(k.TokenHash, token) {
			v.remember(id, now)
			return true, nil
		}
	}
	return false, nil
}

func (v *cacheKeyVerifier) remember(id [32]byte, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for k, e := range v.verified { // few keys: sweeping on insert is enough
		if now.After(e.until) {
			delete(v.verified, k)
		}
	}
	v.verified[id] = verifiedKey{until: now.Add(cacheKeyTTL)}
}
