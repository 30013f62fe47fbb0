package sqldb

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Schema is what one user of the engine layer migrates: its migrations,
// the table recording them and the lock that serialises them. Two schemas
// may share one database when their tables and lock keys differ.
//
// Migrations are files NNNN_description.sql in Dir of Migrations,
// applied in version order, each in its own transaction together with its
// row in the migrations table. A file NNNN_description.<engine>.sql
// (sqlite or postgres) replaces the shared file of that version on that
// engine, for the rare statement the two dialects spell differently.
// Applied migrations must never be edited: add a new version instead.
type Schema struct {
	// Name is the program the schema belongs to ("server", "proxy"), for
	// logs and for the error that asks to upgrade it.
	Name       string
	Migrations fs.FS
	Dir        string // the migrations' directory in Migrations; "" is its root
	// Table records the applied migrations, e.g. "schema_migrations".
	Table string
	// LockKey is the PostgreSQL advisory lock that serialises migrations
	// of processes starting at once against one database.
	LockKey int64
	// SQLiteFile is the database file inside a data directory.
	SQLiteFile string
}

var tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

func (s Schema) check() error {
	if s.Migrations == nil || !tableName.MatchString(s.Table) || s.SQLiteFile == "" || s.Name == "" {
		return errors.New("storage: schema needs a name, migrations, a table name and a SQLite file name")
	}
	return nil
}

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// LoadMigrations reads schema's migrations for engine, sorted by version.
func LoadMigrations(schema Schema, engine Engine) ([]Migration, error) {
	dir := cmp.Or(schema.Dir, ".")
	entries, err := fs.ReadDir(schema.Migrations, dir)
	if err != nil {
		return nil, err
	}
	shared := map[int]Migration{}
	specific := map[int]Migration{}
	for _, e := range entries {
		m, fileEngine, err := parseMigrationName(e.Name())
		if err != nil {
			return nil, err
		}
		if fileEngine != "" && fileEngine != engine {
			continue
		}
		body, err := fs.ReadFile(schema.Migrations, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		m.SQL = string(body)
		target := shared
		if fileEngine != "" {
			target = specific
		}
		if prev, dup := target[m.Version]; dup {
			return nil, fmt.Errorf("storage: migrations %q and %q share version %d", prev.Name, m.Name, m.Version)
		}
		target[m.Version] = m
	}
	for v, m := range specific {
		shared[v] = m
	}
	list := make([]Migration, 0, len(shared))
	for _, m := range shared {
		list = append(list, m)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Version < list[j].Version })
	return list, nil
}

// parseMigrationName splits "0001_initial.sql" or "0001_initial.sqlite.sql".
func parseMigrationName(file string) (Migration, Engine, error) {
	base, ok := strings.CutSuffix(file, ".sql")
	if !ok {
		return Migration{}, "", fmt.Errorf("storage: migration %q does not end in .sql", file)
	}
	var engine Engine
	if stem, e, found := strings.Cut(base, "."); found {
		engine = Engine(e)
		if engine != EngineSQLite && engine != EnginePostgres {
			return Migration{}, "", fmt.Errorf("storage: migration %q names unknown engine %q", file, e)
		}
		base = stem
	}
	num, name, ok := strings.Cut(base, "_")
	version, err := strconv.Atoi(num)
	if !ok || err != nil || len(num) != 4 || version <= 0 {
		return Migration{}, "", fmt.Errorf("storage: migration %q is not named NNNN_description.sql", file)
	}
	return Migration{Version: version, Name: name}, engine, nil
}

// migrate brings the schema up to date. It is idempotent, and concurrent
// callers apply each migration once: on PostgreSQL every step holds a
// transaction-scoped advisory lock, on SQLite every transaction starts
// with BEGIN IMMEDIATE and so holds the database's write lock.
func (db *DB) migrate(ctx context.Context, schema Schema) error {
	migrations, err := LoadMigrations(schema, db.engine)
	if err != nil {
		return err
	}
	err = db.InTx(ctx, func(tx *sql.Tx) error {
		if err := db.lockMigrations(ctx, tx, schema); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+schema.Table+` (
	version    BIGINT PRIMARY KEY,
	name       TEXT   NOT NULL,
	applied_at BIGINT NOT NULL
)`)
		return err
	})
	if err != nil {
		return fmt.Errorf("storage: create %s: %w", schema.Table, err)
	}
	if err := db.checkSchemaNotNewer(ctx, schema, migrations); err != nil {
		return err
	}
	for _, m := range migrations {
		if err := db.applyMigration(ctx, schema, m); err != nil {
			return fmt.Errorf("storage: migration %04d_%s: %w", m.Version, m.Name, err)
		}
	}
	return nil
}

func (db *DB) applyMigration(ctx context.Context, schema Schema, m Migration) error {
	return db.InTx(ctx, func(tx *sql.Tx) error {
		if err := db.lockMigrations(ctx, tx, schema); err != nil {
			return err
		}
		var applied int
		err := tx.QueryRowContext(ctx,
			`SELECT COUNT(*) FROM `+schema.Table+` WHERE version = $1`, m.Version).Scan(&applied)
		if err != nil || applied > 0 {
			return err
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO `+schema.Table+` (version, name, applied_at) VALUES ($1, $2, $3)`,
			m.Version, m.Name, NowMillis()); err != nil {
			return err
		}
		slog.InfoContext(ctx, "applied database migration",
			"schema", schema.Name, "engine", db.engine, "version", m.Version, "name", m.Name)
		return nil
	})
}

// checkSchemaNotNewer refuses a database migrated by a newer program:
// this binary's queries may not match that schema.
func (db *DB) checkSchemaNotNewer(ctx context.Context, schema Schema, migrations []Migration) error {
	newest, err := db.SchemaVersion(ctx)
	if err != nil {
		return fmt.Errorf("storage: read schema version: %w", err)
	}
	known := 0
	if len(migrations) > 0 {
		known = migrations[len(migrations)-1].Version
	}
	if newest > known {
		return fmt.Errorf("storage: database schema version %d is newer than this %s knows (%d); upgrade the %s", newest, schema.Name, known, schema.Name)
	}
	return nil
}

func (db *DB) lockMigrations(ctx context.Context, tx *sql.Tx, schema Schema) error {
	if db.engine != EnginePostgres {
		return nil
	}
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, schema.LockKey)
	return err
}

// SchemaVersion returns the newest applied migration version of db's schema.
func (db *DB) SchemaVersion(ctx context.Context) (int, error) {
	var v sql.NullInt64
	err := db.sql.QueryRowContext(ctx, `SELECT MAX(version) FROM `+db.schema.Table).Scan(&v)
	return int(v.Int64), err
}
