package storage

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migrations live in migrations/ as NNNN_description.sql, applied in
// version order, each in its own transaction together with its row in
// schema_migrations. A file NNNN_description.<engine>.sql (sqlite or
// postgres) replaces the shared file of that version on that engine, for
// the rare statement the two dialects spell differently. Applied
// migrations must never be edited: add a new version instead.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrationLockKey is the PostgreSQL advisory lock that serialises
// migrations of servers starting at once against one database.
// It is an arbitrary constant ("gradient" in ASCII).
const migrationLockKey int64 = 0x6772616469656e74

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version    BIGINT PRIMARY KEY,
	name       TEXT   NOT NULL,
	applied_at BIGINT NOT NULL
)`

// loadMigrations reads the embedded migrations for engine, sorted by version.
func loadMigrations(engine Engine) ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	shared := map[int]migration{}
	specific := map[int]migration{}
	for _, e := range entries {
		m, fileEngine, err := parseMigrationName(e.Name())
		if err != nil {
			return nil, err
		}
		if fileEngine != "" && fileEngine != engine {
			continue
		}
		body, err := fs.ReadFile(migrationFiles, path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		m.sql = string(body)
		target := shared
		if fileEngine != "" {
			target = specific
		}
		if prev, dup := target[m.version]; dup {
			return nil, fmt.Errorf("storage: migrations %q and %q share version %d", prev.name, m.name, m.version)
		}
		target[m.version] = m
	}
	for v, m := range specific {
		shared[v] = m
	}
	list := make([]migration, 0, len(shared))
	for _, m := range shared {
		list = append(list, m)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].version < list[j].version })
	return list, nil
}

// parseMigrationName splits "0001_initial.sql" or "0001_initial.sqlite.sql".
func parseMigrationName(file string) (migration, Engine, error) {
	base, ok := strings.CutSuffix(file, ".sql")
	if !ok {
		return migration{}, "", fmt.Errorf("storage: migration %q does not end in .sql", file)
	}
	var engine Engine
	if stem, e, found := strings.Cut(base, "."); found {
		engine = Engine(e)
		if engine != EngineSQLite && engine != EnginePostgres {
			return migration{}, "", fmt.Errorf("storage: migration %q names unknown engine %q", file, e)
		}
		base = stem
	}
	num, name, ok := strings.Cut(base, "_")
	version, err := strconv.Atoi(num)
	if !ok || err != nil || len(num) != 4 || version <= 0 {
		return migration{}, "", fmt.Errorf("storage: migration %q is not named NNNN_description.sql", file)
	}
	return migration{version: version, name: name}, engine, nil
}

// migrate brings the schema up to date. It is idempotent, and concurrent
// callers apply each migration once: on PostgreSQL every step holds a
// transaction-scoped advisory lock, on SQLite every transaction starts
// with BEGIN IMMEDIATE and so holds the database's write lock.
func (db *DB) migrate(ctx context.Context) error {
	migrations, err := loadMigrations(db.engine)
	if err != nil {
		return err
	}
	err = db.inTx(ctx, func(tx *sql.Tx) error {
		if err := db.lockMigrations(ctx, tx); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, createMigrationsTable)
		return err
	})
	if err != nil {
		return fmt.Errorf("storage: create schema_migrations: %w", err)
	}
	if err := db.checkSchemaNotNewer(ctx, migrations); err != nil {
		return err
	}
	for _, m := range migrations {
		if err := db.applyMigration(ctx, m); err != nil {
			return fmt.Errorf("storage: migration %04d_%s: %w", m.version, m.name, err)
		}
	}
	return nil
}

func (db *DB) applyMigration(ctx context.Context, m migration) error {
	return db.inTx(ctx, func(tx *sql.Tx) error {
		if err := db.lockMigrations(ctx, tx); err != nil {
			return err
		}
		var applied int
		err := tx.QueryRowContext(ctx,
			`SELECT COUNT(*) FROM schema_migrations WHERE version = $1`, m.version).Scan(&applied)
		if err != nil || applied > 0 {
			return err
		}
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
			m.version, m.name, nowMillis()); err != nil {
			return err
		}
		slog.InfoContext(ctx, "applied database migration",
			"engine", db.engine, "version", m.version, "name", m.name)
		return nil
	})
}

// checkSchemaNotNewer refuses a database migrated by a newer server: this
// binary's queries may not match that schema.
func (db *DB) checkSchemaNotNewer(ctx context.Context, migrations []migration) error {
	var newest sql.NullInt64
	if err := db.sql.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&newest); err != nil {
		return fmt.Errorf("storage: read schema version: %w", err)
	}
	known := 0
	if len(migrations) > 0 {
		known = migrations[len(migrations)-1].version
	}
	if newest.Valid && int(newest.Int64) > known {
		return fmt.Errorf("storage: database schema version %d is newer than this server knows (%d); upgrade the server", newest.Int64, known)
	}
	return nil
}

func (db *DB) lockMigrations(ctx context.Context, tx *sql.Tx) error {
	if db.engine != EnginePostgres {
		return nil
	}
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLockKey)
	return err
}

// SchemaVersion returns the newest applied migration version.
func (db *DB) SchemaVersion(ctx context.Context) (int, error) {
	var v sql.NullInt64
	err := db.sql.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v)
	return int(v.Int64), err
}
