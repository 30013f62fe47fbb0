package cache

import (
	"context"
	"sync"
	"time"

	"gradient.dev/gradient/storage"
)

// cacheMemo keeps what every narinfo request would otherwise read or
// compute again: the cache row by name (for a second, so a cache turned
// private is private a second later), the cache's signing key (a cache ID
// never changes keys), and rendered, signed narinfos.
//
// A narinfo is worth keeping: every worker building on the same inputs,
// and every developer substituting them, asks for the same paths, and a
// database lookup plus an ed25519 signature cost several times what
// sending the answer does. A recorded path never changes (the first upload
// wins); it can only be deleted, and deletions go through forgetNarinfo
// (a path) or forgetCache (a cache).
// Misses are not kept: a path uploaded a moment later is found at once.
type cacheMemo struct {
	mu     sync.Mutex
	byName map[string]memoCache
	keys   map[string]storage.SigningKey

	// Narinfos live in two generations: lookups look in both, fills go to
	// the current one, and when it is full the older one is dropped, so
	// paths still asked for survive a turnover.
	narinfos, older map[narinfoKey][]byte
	// forgets counts forgetNarinfo calls: a fill that read the database
	// before a deletion must not store what it read.
	forgets uint64
}

type memoCache struct {
	cache   storage.Cache
	fetched time.Time
}

type narinfoKey struct{ cacheID, storeHash string }

// cacheRowTTL bounds how stale a cache's public flag may be.
const cacheRowTTL = time.Second

// maxMemoNarinfos bounds each generation; a narinfo is about half a
// kilobyte, so both together stay near 32 MiB.
const maxMemoNarinfos = 1 << 15

func newCacheMemo() *cacheMemo {
	return &cacheMemo{
		byName:   map[string]memoCache{},
		keys:     map[string]storage.SigningKey{},
		narinfos: map[narinfoKey][]byte{},
	}
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

// signingKey returns the cache's narinfo signing key.
func (m *cacheMemo) signingKey(ctx context.Context, db *storage.DB, cacheID string) (storage.SigningKey, error) {
	m.mu.Lock()
	key, ok := m.keys[cacheID]
	m.mu.Unlock()
	if ok {
		return key, nil
	}
	key, err := db.CacheSigningKey(ctx, cacheID)
	if err != nil {
		return key, err
	}
	m.mu.Lock()
	m.keys[cacheID] = key
	m.mu.Unlock()
	return key, nil
}

// narinfo returns the kept narinfo of a path, or false and the stamp to
// hand to storeNarinfo after reading the path from the database.
func (m *cacheMemo) narinfo(cacheID, storeHash string) (body []byte, stamp uint64, ok bool) {
	k := narinfoKey{cacheID, storeHash}
	m.mu.Lock()
	defer m.mu.Unlock()
	if body, ok = m.narinfos[k]; ok {
		return body, 0, true
	}
	if body, ok = m.older[k]; ok {
		m.keepNarinfo(k, body) // still asked for: carry it into this generation
		return body, 0, true
	}
	return nil, m.forgets, false
}

// storeNarinfo keeps a narinfo rendered from a database read that started
// when narinfo returned stamp, unless a path was forgotten since.
func (m *cacheMemo) storeNarinfo(cacheID, storeHash string, body []byte, stamp uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forgets == stamp {
		m.keepNarinfo(narinfoKey{cacheID, storeHash}, body)
	}
}

func (m *cacheMemo) keepNarinfo(k narinfoKey, body []byte) {
	if len(m.narinfos) >= maxMemoNarinfos {
		m.older, m.narinfos = m.narinfos, make(map[narinfoKey][]byte, maxMemoNarinfos)
	}
	m.narinfos[k] = body
}

// forgetNarinfo drops a deleted path's narinfo.
func (m *cacheMemo) forgetNarinfo(cacheID, storeHash string) {
	k := narinfoKey{cacheID, storeHash}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgets++
	delete(m.narinfos, k)
	delete(m.older, k)
}

// forgetCache drops all a deleted cache left behind: its row by name, its
// key and its narinfos (its paths went with it).
func (m *cacheMemo) forgetCache(c storage.Cache) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgets++
	delete(m.byName, c.Name)
	delete(m.keys, c.ID)
	for _, gen := range []map[narinfoKey][]byte{m.narinfos, m.older} {
		for k := range gen {
			if k.cacheID == c.ID {
				delete(gen, k)
			}
		}
	}
}
