package storage

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"time"

	"gradient.dev/gradient/secret"
)

// CacheKeyPrefix starts every cache API key as users see it: GRAD<token>.
const CacheKeyPrefix = "GRAD"

// CacheKey is an API key that grants reading one private cache. Only the
// SHA-256 of its token is stored: the token is 384 random bits, so a
// digest cannot be reversed or guessed, and a presented key is found by
// its digest with one indexed lookup however many keys a cache has.
// (argon2id, which slows guessing of weak secrets, is for the worker
// tokens the spec names; here it would only make every wrong key cost a
// hash per key of the cache.)
type CacheKey struct {
	ID        string
	CacheID   string
	CreatedAt time.Time
}

// cacheKeyDigest is the stored form of a token (without the GRAD prefix).
func cacheKeyDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
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
	k := CacheKey{ID: NewID(), CacheID: cacheID, CreatedAt: fromMillis(nowMillis())}
	_, err = db.exec(ctx,
		`INSERT INTO cache_api_keys (id, cache_id, token_digest, created_at) VALUES ($1, $2, $3, $4)`,
		k.ID, k.CacheID, cacheKeyDigest(token), k.CreatedAt.UnixMilli())
	if constraintOf(err) == foreignKeyViolation {
		return CacheKey{}, "", notFound("cache %s", cacheID)
	}
	if err != nil {
		return CacheKey{}, "", err
	}
	return k, CacheKeyPrefix + token, nil
}

// CacheKeyByToken returns the key of cacheID whose token is token (without
// the GRAD prefix), or ErrNotFound. It costs one SHA-256 and one indexed
// lookup whether the token is right or wrong.
func (db *DB) CacheKeyByToken(ctx context.Context, cacheID, token string) (CacheKey, error) {
	digest := cacheKeyDigest(token)
	var k CacheKey
	var stored string
	var created int64
	err := db.hotRow(ctx,
		`SELECT id, cache_id, token_digest, created_at FROM cache_api_keys WHERE token_digest = $1`, digest).
		Scan(&k.ID, &k.CacheID, &stored, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return CacheKey{}, notFound("cache API key")
	}
	if err != nil {
		return CacheKey{}, err
	}
	// The index found the row; the comparison that grants access does
	// not depend on where the digests first differ.
	if subtle.ConstantTimeCompare([]byte(stored), []byte(digest)) != 1 || k.CacheID != cacheID {
		return CacheKey{}, notFound("cache API key")
	}
	k.CreatedAt = fromMillis(created)
	return k, nil
}

// CacheKeys returns a cache's API keys, oldest first.
func (db *DB) CacheKeys(ctx context.Context, cacheID string) ([]CacheKey, error) {
	rows, err := db.sql.QueryContext(ctx,
		`SELECT id, cache_id, created_at FROM cache_api_keys WHERE cache_id = $1 ORDER BY created_at, id`, cacheID)
	return collect(rows, err, func(r *sql.Rows) (CacheKey, error) {
		var k CacheKey
		var created int64
		err := r.Scan(&k.ID, &k.CacheID, &created)
		k.CreatedAt = fromMillis(created)
		return k, err
	})
}

// DeleteCacheKey revokes a key.
func (db *DB) DeleteCacheKey(ctx context.Context, cacheID, keyID string) error {
	res, err := db.exec(ctx, `DELETE FROM cache_api_keys WHERE cache_id = $1 AND id = $2`, cacheID, keyID)
	return affectedOne(res, err, "key %s of cache %s", keyID, cacheID)
}
