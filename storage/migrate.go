package storage

import (
	"context"
	"embed"

	"gradient.dev/gradient/storage/sqldb"
)

// Migrations live in migrations/ as NNNN_description.sql (per-engine
// variants NNNN_description.<engine>.sql), applied at Open by sqldb in
// version order, each in its own transaction together with its row in
// schema_migrations. Applied migrations must never be edited: add a new
// version instead.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockKey is the PostgreSQL advisory lock that serialises
// migrations of servers starting at once against one database.
// It is an arbitrary constant ("gradient" in ASCII).
const migrationLockKey int64 = 0x6772616469656e74

// sqliteFileName is the database file inside a data directory.
const sqliteFileName = "gradient.db"

// schema is the server's schema for sqldb.
var schema = sqldb.Schema{
	Name:       "server",
	Migrations: migrationFiles,
	Dir:        "migrations",
	Table:      "schema_migrations",
	LockKey:    migrationLockKey,
	SQLiteFile: sqliteFileName,
}

// SchemaVersion returns the newest applied migration version.
func (db *DB) SchemaVersion(ctx context.Context) (int, error) { return db.base.SchemaVersion(ctx) }
