package cache

import (
	"context"
	"sync"
	"time"

	"gradient.dev/gradient/storage"
)

// servedBatch remembers when narinfos were served, for the size cap's
// least-recently-served order, and writes them to the database in one
// batch per flush instead of one UPDATE per request.
type servedBatch struct {
	mu   sync.Mutex
	when map[narinfoKey]time.Time
}

// maxServed bounds the batch between flushes; past it, paths served are
// not noted until the next flush (their order is only a little older).
const maxServed = 1 << 16

func (s *servedBatch) note(cacheID, storeHash string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.when == nil {
		s.when = map[narinfoKey]time.Time{}
	}
	k := narinfoKey{cacheID, storeHash}
	if _, ok := s.when[k]; ok || len(s.when) < maxServed {
		s.when[k] = at
	}
}

// noteRow notes a row served over a worker session (a Pull answer or a
// NAR stream), in the same batch as the HTTP narinfos.
func (s *servedBatch) noteRow(p storage.CachePath, at time.Time) {
	if h, err := storage.StorePathHash(p.StorePath); err == nil {
		s.note(p.CacheID, h, at)
	}
}

func (s *servedBatch) take() []storage.CacheServed {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]storage.CacheServed, 0, len(s.when))
	for k, at := range s.when {
		out = append(out, storage.CacheServed{CacheID: k.cacheID, StoreHash: k.storeHash, At: at})
	}
	s.when = nil
	return out
}

// FlushServed writes when paths were last served to the database.
func (bc *Cache) FlushServed(ctx context.Context) error {
	served := bc.served.take()
	if len(served) == 0 {
		return nil
	}
	return bc.db.NoteCachePathsServed(ctx, served)
}

// ForgetNarinfos drops every remembered narinfo: a collection deleted
// rows.
func (bc *Cache) ForgetNarinfos() { bc.cacheMemo.forgetNarinfos() }

func (m *cacheMemo) forgetNarinfos() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgets++
	m.narinfos = map[narinfoKey][]byte{}
	m.older = nil
}
