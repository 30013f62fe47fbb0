// Package proxystore is gradient-proxy's database: tenants, their
// upstream links (the tenant server's /proto URL, the proxy's worker ID
// there and one sealed token per peer), the proxy's own authorized
// workers (argon2id token hashes, allowed capabilities) and the metering
// of VMs it boots (docs/protocol/federation.md). It runs on the server's engine layer,
// storage/sqldb: embedded SQLite by default, or PostgreSQL, with its own
// migrations, migrations table and advisory lock.
//
// Upstream tokens are the only secrets kept reversibly: sealed with
// AES-256-GCM (sealbox) under the proxy's encryption key and bound to
// (tenant, peer), and returned by LinkTokens alone. Views carry peer IDs,
// never tokens. Worker tokens are shown once by CreateWorker and stored
// as argon2id hashes only.
//
// Methods wrap sqldb.ErrNotFound, ErrConflict or ErrInvalid (the same
// values as storage's), with a message naming the record.
package proxystore

import (
	"context"
	"database/sql"
	"embed"
	"errors"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb"
)

// The proxy's migrations, NNNN_description[.engine].sql (see sqldb.Schema).
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// schema keeps the proxy's tables apart from a server's in a shared
// database: its own migrations table and advisory lock ("gradprox").
var schema = sqldb.Schema{
	Name:       "proxy",
	Migrations: migrationFiles,
	Dir:        "migrations",
	Table:      "proxy_schema_migrations",
	LockKey:    0x6772616470726f78,
	SQLiteFile: "proxy.db",
}

// Store is the proxy's database. It is safe for concurrent use.
type Store struct {
	db  *sqldb.DB
	sql *sql.DB
	box *sealbox.Box // seals upstream tokens
}

// Open connects to the database at rawURL (the forms of sqldb.Open; a
// data directory holds proxy.db), applies pending migrations, and seals
// upstream tokens with box (GRADIENT_PROXY_ENCRYPTION_KEY_FILE's key).
func Open(ctx context.Context, rawURL string, box *sealbox.Box) (*Store, error) {
	if box == nil {
		return nil, errors.New("proxystore: an encryption key is required to seal upstream tokens")
	}
	db, err := sqldb.Open(ctx, rawURL, schema)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, sql: db.SQL(), box: box}, nil
}

// Engine reports which database engine the store uses.
func (s *Store) Engine() sqldb.Engine { return s.db.Engine() }

// Ping checks that the database is reachable.
func (s *Store) Ping(ctx context.Context) error { return s.db.Ping(ctx) }

// Close releases the connection pool.
func (s *Store) Close() error { return s.db.Close() }
