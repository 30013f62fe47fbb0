package storage

import (
	"errors"
	"testing"
)

// Migration 0013 replaces argon2id key rows (which no digest lookup can
// find) by the digest table: old keys are gone, new ones are found.
func TestCacheKeyDigestMigrationDropsArgon2Keys(t *testing.T) {
	t.Parallel()
	forEachEngineURL(t, func(t *testing.T, engine Engine, dbURL string) {
		db := openTestDB(t, dbURL)
		ctx := t.Context()
		c, err := db.CreateCache(ctx, NewCache{Name: "private"})
		if err != nil {
			t.Fatal(err)
		}
		// Back to the schema before 0013, with a key made then.
		for _, stmt := range []string{
			`DELETE FROM schema_migrations WHERE version = 13`,
			`DROP TABLE cache_api_keys`,
			`CREATE TABLE cache_api_keys (id TEXT PRIMARY KEY, cache_id TEXT NOT NULL REFERENCES caches (id) ON DELETE CASCADE,
				token_hash TEXT NOT NULL, created_at BIGINT NOT NULL)`,
			`CREATE INDEX cache_api_keys_cache ON cache_api_keys (cache_id)`,
		} {
			if _, err := db.sql.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
		if _, err := db.sql.ExecContext(ctx, `INSERT INTO cache_api_keys (id, cache_id, token_hash, created_at) VALUES ($1, $2, $3, 0)`,
			NewID(), c.ID, "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0c2FsdA$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaGhhc2g"); err != nil {
			t.Fatal(err)
		}
		db.Close()

		db = openTestDB(t, dbURL)
		if keys, err := db.CacheKeys(ctx, c.ID); err != nil || len(keys) != 0 {
			t.Fatalf("keys after the migration: %v, %v (argon2id rows must be gone)", keys, err)
		}
		k, text, err := db.CreateCacheKey(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := db.CacheKeyByToken(ctx, c.ID, text[len(CacheKeyPrefix):]); err != nil || got.ID != k.ID {
			t.Fatalf("new key after the migration: %+v, %v", got, err)
		}
		if _, err := db.CacheKeyByToken(ctx, c.ID, "wrong"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("wrong token: %v", err)
		}
	})
}
