package storage

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// Cache is a binary cache the server serves and signs paths into.
type Cache struct {
	ID        string
	Name      string
	Public    bool // readable without credentials
	CreatedAt time.Time
	publicKey string
}

// PublicKey is the cache's public signing key in Nix's NAME:base64 form,
// for operators to add to trusted-public-keys.
func (c Cache) PublicKey() string { return c.publicKey }

// NewCache is the input of CreateCache.
type NewCache struct {
	Name   string
	Public bool
	// KeyName names the signing key; empty means the cache name. The spec
	// suggests <host>-<cache name> so keys of different servers differ.
	KeyName string
}

const cacheColumns = `id, name, public, public_key, created_at`

func scanCache(row interface{ Scan(...any) error }) (Cache, error) {
	var c Cache
	var created int64
	err := row.Scan(&c.ID, &c.Name, &c.Public, &c.publicKey, &created)
	c.CreatedAt = fromMillis(created)
	return c, err
}

// CreateCache adds a cache with a newly generated signing key pair.
// A taken name is ErrConflict.
func (db *DB) CreateCache(ctx context.Context, in NewCache) (Cache, error) {
	if err := validName("cache", in.Name); err != nil {
		return Cache{}, err
	}
	keyName := in.KeyName
	if keyName == "" {
		keyName = in.Name
	}
	key, err := GenerateSigningKey(keyName)
	if err != nil {
		return Cache{}, err
	}
	c := Cache{
		ID: NewID(), Name: in.Name, Public: in.Public,
		CreatedAt: fromMillis(nowMillis()), publicKey: key.PublicKeyText(),
	}
	_, err = db.exec(ctx,
		`INSERT INTO caches (id, name, public, secret_key, public_key, created_at)
		 VALUES ($1, $2, $3, $4, $5, $6)`,
		c.ID, c.Name, c.Public, db.storedSigningKey(c.ID, key), c.publicKey, c.CreatedAt.UnixMilli())
	if constraintOf(err) == uniqueViolation {
		return Cache{}, conflict("cache %q already exists", in.Name)
	}
	return c, err
}

// Cache returns the cache with id.
func (db *DB) Cache(ctx context.Context, id string) (Cache, error) {
	id, err := canonicalUUID("cache ID", id)
	if err != nil {
		return Cache{}, err
	}
	c, err := scanCache(db.sql.QueryRowContext(ctx, `SELECT `+cacheColumns+` FROM caches WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Cache{}, notFound("cache %s", id)
	}
	return c, err
}

// CacheByName returns the cache called name.
func (db *DB) CacheByName(ctx context.Context, name string) (Cache, error) {
	c, err := scanCache(db.sql.QueryRowContext(ctx, `SELECT `+cacheColumns+` FROM caches WHERE name = $1`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Cache{}, notFound("cache %q", name)
	}
	return c, err
}

// ListCaches returns every cache, by name.
func (db *DB) ListCaches(ctx context.Context) ([]Cache, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT `+cacheColumns+` FROM caches ORDER BY name`)
	return collect(rows, err, func(r *sql.Rows) (Cache, error) { return scanCache(r) })
}

// SetCachePublic makes a cache readable without credentials, or not.
func (db *DB) SetCachePublic(ctx context.Context, id string, public bool) error {
	id, err := canonicalUUID("cache ID", id)
	if err != nil {
		return err
	}
	res, err := db.exec(ctx, `UPDATE caches SET public = $1 WHERE id = $2`, public, id)
	return affectedOne(res, err, "cache %s", id)
}

// CacheSigningKey returns a cache's secret signing key, for signing
// narinfos. Keep it out of logs and API responses. A sealed key the
// database cannot open is ErrSealedKey.
func (db *DB) CacheSigningKey(ctx context.Context, id string) (SigningKey, error) {
	id, err := canonicalUUID("cache ID", id)
	if err != nil {
		return SigningKey{}, err
	}
	var text string
	err = db.sql.QueryRowContext(ctx, `SELECT secret_key FROM caches WHERE id = $1`, id).Scan(&text)
	if errors.Is(err, sql.ErrNoRows) {
		return SigningKey{}, notFound("cache %s", id)
	}
	if err != nil {
		return SigningKey{}, err
	}
	return db.openSigningKey(id, text)
}

// DeleteCache removes a cache with its subscriptions and worker registrations.
func (db *DB) DeleteCache(ctx context.Context, id string) error {
	id, err := canonicalUUID("cache ID", id)
	if err != nil {
		return err
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM caches WHERE id = $1`, id)
		if err := affectedOne(res, err, "cache %s", id); err != nil {
			return err
		}
		return deletePeerRegistrations(ctx, tx, Peer{Kind: PeerCache, ID: id})
	})
}
