package server

import (
	"context"
	"sync"
	"time"

	"gradient.dev/gradient/storage"
)

// cacheMemo keeps what every narinfo request would otherwise read or
// compute again: the cache row by name (for a second, so a cache turned
// private is private a second later), the cache's signing key (a cache ID
// never changes keys), and narinfo signatures (ed25519 is deterministic:
// the same key and fingerprint always give the same signature).
type cacheMemo struct {
	mu     sync.Mutex
	byName map[string]memoCache
	keys   map[string]storage.SigningKey
	sigs   map[sigKey]string
}

type memoCache struct {
	cache   storage.Cache
	fetched time.Time
}

type sigKey struct{ cacheID, fingerprint string }

// cacheRowTTL bounds how stale a cache's public flag may be.
const cacheRowTTL = time.Second

// maxMemoSigs bounds the signature memo; it is dropped whole when full,
// which costs one signature per path afterwards.
const maxMemoSigs = 1 << 16

func newCacheMemo() *cacheMemo {
	return &cacheMemo{byName: map[string]memoCache{}, keys: map[string]storage.SigningKey{}, sigs: map[sigKey]string{}}
}

func (m *cacheMemo) cacheByName(ctx context.Context, db *storage.DB, name string) (storage.Cache, error) {
	m.mu.Lock()
	e, ok := m.byName[name]
	m.mu.Unlock()
	if ok && time.Since(e.fetched) < cacheRowTTL {
		return e.cache, nil
	}
	c, err := db.CacheByName(ctx, name)
	if err != nil {
		return c, err
	}
	m.mu.Lock()
	m.byName[name] = memoCache{cache: c, fetched: time.Now()}
	m.mu.Unlock()
	return c, nil
}

// sign returns the narinfo signature of fingerprint with the cache's key.
func (m *cacheMemo) sign(ctx context.Context, db *storage.DB, cacheID, fingerprint string) (string, error) {
	k := sigKey{cacheID, fingerprint}
	m.mu.Lock()
	sig, ok := m.sigs[k]
	key, haveKey := m.keys[cacheID]
	m.mu.Unlock()
	if ok {
		return sig, nil
	}
	if !haveKey {
		var err error
		if key, err = db.CacheSigningKey(ctx, cacheID); err != nil {
			return "", err
		}
	}
	sig = key.Sign([]byte(fingerprint))
	m.mu.Lock()
	m.keys[cacheID] = key
	if len(m.sigs) >= maxMemoSigs {
		m.sigs = map[sigKey]string{}
	}
	m.sigs[k] = sig
	m.mu.Unlock()
	return sig, nil
}
