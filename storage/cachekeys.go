package storage

import (
	"context"
	"database/sql"
	"time"

	"gradient.dev/gradient/secret"
)

// CacheKeyPrefix starts every cache API key as users see it: GRAD<token>.
const CacheKeyPrefix = "GRAD"

// CacheKey is an API key that grants reading one private cache.
type CacheKey struct {
	ID        string
	CacheID   string
	TokenHash string // argon2id PHC of the token (without the GRAD prefix)
	CreatedAt time.Time
}

// CreateCacheKey makes a key for a cache and returns it with the key text
// (GRAD<token>), which is shown once and never stored.
func (db *DB) CreateCacheKey(ctx context.Context, cacheID string) (CacheKey, string, error) {
	cacheID, err := canonicalUUID("cache ID", cacheID)
	if err != nil {
		return CacheKey{}, "", err
	}
	token, err := secret.Generate()
	if err != nil {
		return CacheKey{}, "", err
	}
	hash, err := secret.Hash(token)
	if err != nil {
		return CacheKey{}, "", err
	}
	k := CacheKey{ID: NewID(), CacheID: cacheID, TokenHash: hash, CreatedAt: fromMillis(nowMillis())}
	_, err = db.exec(ctx,
		`INSERT INTO cache_api_keys (id, cache_id, token_hash, created_at) VALUES ($1, $2, $3, $4)`,
		k.ID, k.CacheID, k.TokenHash, k.CreatedAt.UnixMilli())
	if constraintOf(err) == foreignKeyViolation {
		return CacheKey{}, "", notFound("cache %s", cacheID)
	}
	if err != nil {
		return CacheKey{}, "", err
	}
	return k, CacheKeyPrefix + token, nil
}

// CacheKeys returns a cache's API keys, oldest first.
func (db *DB) CacheKeys(ctx context.Context, cacheID string) ([]CacheKey, error) {
	rows, err := db.sql.QueryContext(ctx,
		`SELECT id, cache_id, token_hash, created_at FROM cache_api_keys WHERE cache_id = $1 ORDER BY created_at, id`, cacheID)
	return collect(rows, err, func(r *sql.Rows) (CacheKey, error) {
		var k CacheKey
		var created int64
		err := r.Scan(&k.ID, &k.CacheID, &k.TokenHash, &created)
		k.CreatedAt = fromMillis(created)
		return k, err
	})
}

// DeleteCacheKey revokes a key.
func (db *DB) DeleteCacheKey(ctx context.Context, cacheID, keyID string) error {
	res, err := db.exec(ctx, `DELETE FROM cache_api_keys WHERE cache_id = $1 AND id = $2`, cacheID, keyID)
	return affectedOne(res, err, "key %s of cache %s", keyID, cacheID)
}
