package storage

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"time"

	"gradient.dev/gradient/storepath"
)

// CachePath is one store path a cache serves: the narinfo metadata and
// the NAR store key of its compressed NAR.
type CachePath struct {
	CacheID     string
	StorePath   string // /nix/store/<hash>-<name>
	NarHash     string // sha256:<nix32>
	NarSize     int64
	FileHash    string // sha256:<nix32> of the compressed object
	FileSize    int64
	Compression string   // "zstd"
	References  []string // base names <hash>-<name>, sorted
	Deriver     string   // base name, or empty
	CA          string   // content address, or empty
	ObjectKey   string
	CreatedAt   time.Time
	// Pushed: an operator pushed the path, so it is a collection root
	// until deleted or until ExpiresAt (zero: no time to live). Set on
	// insert only; SetCachePathPushed changes a recorded path.
	Pushed    bool
	ExpiresAt time.Time
}

// StoreDir is the only Nix store directory the caches serve.
const StoreDir = storepath.Dir

// StoreHashLen is the length of a store path's hash part.
const StoreHashLen = storepath.HashLen

// StorePathHash returns the hash part of /nix/store/<hash>-<name> or of a
// base name <hash>-<name>, checked by Nix's rules (package storepath).
func StorePathHash(path string) (string, error) {
	hash, err := storepath.Hash(path)
	if err != nil {
		return "", invalid("%v", err)
	}
	return hash, nil
}

const cachePathColumns = `cache_id, store_path, nar_hash, nar_size, file_hash, file_size,
	compression, refs, deriver, ca, object_key, created_at`

func scanCachePath(row interface{ Scan(...any) error }) (CachePath, error) {
	var p CachePath
	var refs string
	var created int64
	err := row.Scan(&p.CacheID, &p.StorePath, &p.NarHash, &p.NarSize, &p.FileHash, &p.FileSize,
		&p.Compression, &refs, &p.Deriver, &p.CA, &p.ObjectKey, &created)
	p.References = strings.Fields(refs)
	p.CreatedAt = fromMillis(created)
	return p, err
}

// PutCachePath records a path in a cache. It is idempotent: a path
// already recorded keeps its row (the first upload wins) and is returned
// with created false.
func (db *DB) PutCachePath(ctx context.Context, in CachePath) (p CachePath, created bool, err error) {
	cacheID, err := canonicalUUID("cache ID", in.CacheID)
	if err != nil {
		return CachePath{}, false, err
	}
	// The last check before a row that narinfos are signed from.
	hash, _, err := storepath.Parse(in.StorePath)
	if err != nil {
		return CachePath{}, false, invalid("%v", err)
	}
	refs := make([]string, 0, len(in.References))
	for _, r := range in.References {
		b, err := storepath.Base(r)
		if err != nil {
			return CachePath{}, false, invalid("reference: %v", err)
		}
		refs = append(refs, b)
	}
	slices.Sort(refs)
	refs = slices.Compact(refs)
	deriver := in.Deriver
	if deriver != "" {
		if deriver, err = storepath.Base(deriver); err != nil {
			return CachePath{}, false, invalid("deriver: %v", err)
		}
	}
	if in.CA != "" {
		if err := storepath.CheckCA(in.CA); err != nil {
			return CachePath{}, false, invalid("%v", err)
		}
	}
	if in.NarHash == "" || in.FileHash == "" || in.ObjectKey == "" || in.NarSize <= 0 || in.FileSize <= 0 {
		return CachePath{}, false, invalid("cache path %s lacks hashes, sizes or object", in.StorePath)
	}
	p = in
	p.CacheID, p.References, p.Deriver = cacheID, refs, deriver
	p.CreatedAt = fromMillis(nowMillis())
	put, err := db.cachePaths.Do(ctx, cachePathPut{row: p, hash: hash})
	return put.row, put.created, err
}

// CachePath returns the path with the given hash part in a cache.
func (db *DB) CachePath(ctx context.Context, cacheID, storeHash string) (CachePath, error) {
	p, err := scanCachePath(db.hotRow(ctx, selectCachePathSQL, cacheID, storeHash))
	if errors.Is(err, sql.ErrNoRows) {
		return CachePath{}, notFound("path %s in cache %s", storeHash, cacheID)
	}
	return p, err
}

// CachePathByObject returns a path of a cache whose NAR is the object key.
func (db *DB) CachePathByObject(ctx context.Context, cacheID, objectKey string) (CachePath, error) {
	p, err := scanCachePath(db.hotRow(ctx,
		`SELECT `+cachePathColumns+` FROM cache_paths WHERE cache_id = $1 AND object_key = $2
		 ORDER BY store_hash LIMIT 1`, cacheID, objectKey))
	if errors.Is(err, sql.ErrNoRows) {
		return CachePath{}, notFound("object %s in cache %s", objectKey, cacheID)
	}
	return p, err
}

// ListCachePaths returns a cache's paths by store path.
func (db *DB) ListCachePaths(ctx context.Context, cacheID string) ([]CachePath, error) {
	rows, err := db.sql.QueryContext(ctx,
		`SELECT `+cachePathColumns+` FROM cache_paths WHERE cache_id = $1 ORDER BY store_path`, cacheID)
	return collect(rows, err, func(r *sql.Rows) (CachePath, error) { return scanCachePath(r) })
}

// DeleteCachePath removes a path from a cache. It returns whether another
// row still uses the object; an object no row uses is queued for
// deletion in the same transaction (DeleteQueuedObjects deletes it).
func (db *DB) DeleteCachePath(ctx context.Context, cacheID, storeHash string) (objectKey string, objectInUse bool, err error) {
	err = db.inTx(ctx, func(tx *sql.Tx) error {
		var size int64
		err := tx.QueryRowContext(ctx,
			`DELETE FROM cache_paths WHERE cache_id = $1 AND store_hash = $2 RETURNING object_key, file_size`,
			cacheID, storeHash).Scan(&objectKey, &size)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("path %s in cache %s", storeHash, cacheID)
		}
		if err != nil {
			return err
		}
		objectInUse, err = exists(ctx, tx, `SELECT 1 FROM cache_paths WHERE object_key = $1 LIMIT 1`, objectKey)
		if err != nil || objectInUse {
			return err
		}
		return queueObjectIfUnused(ctx, tx, objectKey, size)
	})
	return objectKey, objectInUse, err
}

// SetCachePathPushed makes a recorded path an operator's root again, until
// expires (zero: no time to live).
func (db *DB) SetCachePathPushed(ctx context.Context, cacheID, storeHash string, expires time.Time) error {
	var exp any
	if !expires.IsZero() {
		exp = expires.UnixMilli()
	}
	res, err := db.exec(ctx, `UPDATE cache_paths SET pushed = TRUE, expires_at = $3
		WHERE cache_id = $1 AND store_hash = $2`, cacheID, storeHash, exp)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return notFound("path %s in cache %s", storeHash, cacheID)
	}
	return nil
}
