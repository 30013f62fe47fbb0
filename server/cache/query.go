package cache

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// CacheQuery (docs/protocol/cache.md §2): Normal lists the cached paths with sizes,
// Pull answers every path with what a download needs, Push says which
// paths still need an upload. QueryKnownDerivations rides on the same
// lookup.

func (c *Conn) goQuery(q *wire.CacheQuery) {
	if len(q.Paths) > cacheQueryMaxPaths {
		c.send(&wire.CacheError{QueryID: q.QueryID, Message: fmt.Sprintf(
			"a CacheQuery names at most %d paths, this one %d: split it", cacheQueryMaxPaths, len(q.Paths))})
		return
	}
	c.spawn(func() {
		if !c.acquire(c.ctx, c.queries) {
			return
		}
		defer func() { <-c.queries }()
		ctx, cancel := context.WithTimeout(c.ctx, cacheQueryBudget)
		defer cancel()
		reply, err := c.answerQuery(ctx, q)
		if err != nil {
			if c.ctx.Err() != nil {
				return // the connection ended
			}
			// CacheError means "unknown, retry": never "not cached".
			c.log.Warn("cache query failed", "query", q.QueryID, "paths", len(q.Paths), "error", err)
			c.send(&wire.CacheError{QueryID: q.QueryID, Message: "cache state unknown: " + err.Error()})
			return
		}
		c.send(reply)
	})
}

func (c *Conn) answerQuery(ctx context.Context, q *wire.CacheQuery) (wire.ServerMessage, error) {
	var caches []storage.Cache
	var err error
	if q.Mode == wire.QueryPush {
		var scope WriteScope
		scope, err = c.scope.Writable(ctx, q.JobID)
		caches = scope.Caches
	} else {
		caches, err = c.scope.Readable(ctx)
	}
	if err != nil {
		return nil, err
	}
	// A Push answer's rows are reused (touched): the worker skips their
	// upload, so a collection must keep them (docs/protocol/cache.md §10.1).
	found, err := c.lookup(ctx, caches, q.Paths, q.Mode == wire.QueryPush)
	if err != nil {
		return nil, err
	}
	reply := &wire.CacheStatus{QueryID: q.QueryID, Cached: make([]wire.CachedPath, 0, len(q.Paths))}
	keys := map[string]storage.SigningKey{} // per cache, for Pull signatures
	for _, path := range q.Paths {
		rows := found[path]
		switch {
		case q.Mode == wire.QueryNormal && len(rows) > 0:
			reply.Cached = append(reply.Cached, wire.CachedPath{Path: path, Cached: true,
				FileSize: u64(rows[0].FileSize), NarSize: u64(rows[0].NarSize)})
		case q.Mode == wire.QueryNormal:
			// [M]: uncached paths are absent from a Normal reply.
		case q.Mode == wire.QueryPull && len(rows) > 0:
			entry, err := c.pullEntry(ctx, path, rows, keys)
			if err != nil {
				return nil, err
			}
			reply.Cached = append(reply.Cached, entry)
		case q.Mode == wire.QueryPush && len(rows) > 0:
			// Stored in one writable cache: record it in the others now,
			// so the worker can skip the upload (docs/protocol/cache.md §2.1).
			if err := c.s.recordInCaches(ctx, rows[0], caches); err != nil {
				return nil, err
			}
			reply.Cached = append(reply.Cached, wire.CachedPath{Path: path, Cached: true})
		default:
			reply.Cached = append(reply.Cached, wire.CachedPath{Path: path})
		}
	}
	if n := cacheStatusSize(reply); n > safeInflightMessageSize {
		return nil, fmt.Errorf("the answer (%d bytes) would exceed %d bytes: query fewer paths", n, safeInflightMessageSize)
	}
	return reply, nil
}

// lookup finds the rows of paths in caches, keyed by the path as the
// client wrote it; reuse marks the rows found as reused now
// (storage.DB.ReuseCachePaths). Paths whose hash part is malformed are
// ignored.
func (c *Conn) lookup(ctx context.Context, caches []storage.Cache, paths []string, reuse bool) (map[string][]storage.CachePath, error) {
	if len(caches) == 0 || len(paths) == 0 {
		return nil, nil
	}
	ids := make([]string, len(caches))
	for i, cache := range caches {
		ids[i] = cache.ID
	}
	hashes := make([]string, 0, len(paths))
	pathsOf := map[string][]string{}
	for _, p := range paths {
		h, err := storage.StorePathHash(p)
		if err != nil {
			continue
		}
		if _, dup := pathsOf[h]; !dup {
			hashes = append(hashes, h)
		}
		pathsOf[h] = append(pathsOf[h], p)
	}
	find := c.s.db.FindCachePaths
	if reuse {
		find = c.s.db.ReuseCachePaths
	}
	rows, err := find(ctx, ids, hashes)
	if err != nil {
		return nil, err
	}
	found := map[string][]storage.CachePath{}
	for _, r := range rows {
		h, _ := storage.StorePathHash(r.StorePath)
		for _, p := range pathsOf[h] {
			found[p] = append(found[p], r)
		}
	}
	return found, nil
}

// pullEntry is a Pull answer for a cached path: the metadata of the
// first row, signed by every readable cache holding it.
func (c *Conn) pullEntry(ctx context.Context, path string, rows []storage.CachePath, keys map[string]storage.SigningKey) (wire.CachedPath, error) {
	p := rows[0]
	refs := make([]string, len(p.References))
	for i, r := range p.References {
		refs[i] = storage.StoreDir + "/" + r
	}
	sigs := make([]string, 0, len(rows))
	for _, r := range rows {
		key, ok := keys[r.CacheID]
		if !ok {
			var err error
			if key, err = c.s.db.CacheSigningKey(ctx, r.CacheID); err != nil {
				return wire.CachedPath{}, err
			}
			keys[r.CacheID] = key
		}
		sigs = append(sigs, key.Sign(Fingerprint(r)))
		c.s.served.noteRow(r, time.Now())
	}
	e := wire.CachedPath{Path: path, Cached: true,
		FileSize: u64(p.FileSize), NarSize: u64(p.NarSize),
		NarHash: &p.NarHash, FileHash: &p.FileHash, References: &refs, Signatures: &sigs}
	if p.Deriver != "" {
		d := storage.StoreDir + "/" + p.Deriver
		e.Deriver = &d
	}
	if p.CA != "" {
		e.CA = &p.CA
	}
	// Objects of a presigning store are fetched straight from it, all of
	// them unless a minimum size is configured (docs/protocol/cache.md
	// §2.1); presigning is local signing, no I/O.
	if ps, min := c.s.presigner, c.s.cfg.Presign.PullURLMinBytes; ps != nil && (min <= 0 || p.FileSize > min) {
		if url, err := ps.PresignGet(ctx, p.ObjectKey); err == nil {
			e.URL = &url
		} else {
			c.log.Warn("pull: cannot presign, the worker streams instead", "path", path, "error", err)
		}
	}
	return e, nil
}

// cacheStatusSize bounds the encoded size of a CacheStatus from above
// (strings plus a generous per-field allowance).
func cacheStatusSize(m *wire.CacheStatus) int {
	n := 64 + len(m.QueryID)
	str := func(s *string) {
		if s != nil {
			n += len(*s) + 10
		}
	}
	list := func(l *[]string) {
		if l != nil {
			for _, s := range *l {
				n += len(s) + 10
			}
		}
	}
	for i := range m.Cached {
		e := &m.Cached[i]
		n += len(e.Path) + 64
		str(e.URL)
		str(e.NarHash)
		str(e.FileHash)
		str(e.Deriver)
		str(e.CA)
		list(e.References)
		list(e.Signatures)
	}
	return n
}

func (c *Conn) goKnownDerivations(q *wire.QueryKnownDerivations) {
	c.spawn(func() {
		ctx, cancel := context.WithTimeout(c.ctx, cacheQueryBudget)
		defer cancel()
		known := []string{}
		var drvs []string
		for _, p := range q.DrvPaths {
			if strings.HasSuffix(p, ".drv") {
				drvs = append(drvs, p)
			}
		}
		// Known means built with every output in a cache this worker
		// reads, not merely a cached .drv: a walk that stopped at a
		// derivation still to be built would leave its dependents without
		// their inputs.
		built, err := c.s.queue.BuiltDerivations(ctx, drvs)
		var outputs []string
		for _, paths := range built {
			outputs = append(outputs, paths...)
		}
		var caches []storage.Cache
		var found map[string][]storage.CachePath
		if err == nil {
			caches, err = c.scope.Readable(ctx)
		}
		if err == nil {
			found, err = c.lookup(ctx, caches, outputs, false)
		}
		if err != nil {
			// "Nothing known" only costs a longer evaluation walk.
			c.log.Warn("known derivations query failed", "query", q.QueryID, "error", err)
		} else {
			for _, drv := range drvs {
				paths, ok := built[drv]
				if ok && len(paths) > 0 && !slices.ContainsFunc(paths, func(p string) bool { return len(found[p]) == 0 }) {
					known = append(known, drv)
				}
			}
		}
		c.send(&wire.KnownDerivations{QueryID: q.QueryID, Known: known})
	})
}

// recordInCaches records the path of p (an existing row, so its object is
// stored) in every cache of caches that lacks it.
func (s *Cache) recordInCaches(ctx context.Context, p storage.CachePath, caches []storage.Cache) error {
	for _, cache := range caches {
		if cache.ID == p.CacheID {
			continue
		}
		row := p
		row.CacheID = cache.ID
		if _, _, err := s.db.PutCachePath(ctx, row); err != nil {
			return err
		}
	}
	return nil
}

func u64(n int64) *uint64 {
	v := uint64(n)
	return &v
}
