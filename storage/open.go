package storage

import (
	"context"
	"database/sql"
	"sync"

	"gradient.dev/gradient/storage/sqldb"
)

// Engine names the database engine behind a DB.
type Engine = sqldb.Engine

const (
	EngineSQLite   = sqldb.EngineSQLite
	EnginePostgres = sqldb.EnginePostgres
)

// DB is the server's database. Both engines go through database/sql with
// one set of queries, so every method behaves the same on either.
type DB struct {
	base   *sqldb.DB // the engine layer: connection, migrations, writer queue
	sql    *sql.DB   // base's pool, for the queries
	engine Engine

	// Narinfo rows of concurrent upload commits share a transaction
	// (putCachePaths), on either engine.
	cachePaths *sqldb.Batcher[cachePathPut, cachePathPut]

	// sealer, when set, seals caches' signing keys at rest (SealSecretsWith).
	sealer SecretSealer

	// schemaTag names this schema's notification channels, read once
	// (channelFor).
	channelMu sync.Mutex
	schemaTag string

	// objectCheck, when set, confirms a NAR object exists before its
	// first reference is inserted (retention_objects.go).
	objectCheck ObjectCheck

	// gcHooks, set only by tests, force interleavings of a collection's
	// deletion with other writers (retention_fortest.go).
	gcHooks *GCHooks
}

// Open connects to the database at rawURL and applies pending migrations.
//
// Accepted forms:
//
//	postgres://user@host:5432/db?sslmode=disable  (also postgresql://)
//	sqlite:///abs/path/gradient.db                 an absolute database file
//	sqlite://relative/dir/gradient.db              a file relative to the working directory
//	sqlite:///abs/dir/  or  /var/lib/gradient      a data directory: <dir>/gradient.db
//
// A plain path without a scheme is always a data directory. A sqlite://
// path naming an existing directory, or ending in '/', is one too.
func Open(ctx context.Context, rawURL string) (*DB, error) {
	base, err := sqldb.Open(ctx, rawURL, schema)
	if err != nil {
		return nil, err
	}
	db := &DB{base: base, sql: base.SQL(), engine: base.Engine()}
	db.cachePaths = db.newCachePathBatcher()
	return db, nil
}

// Engine reports which database engine db uses.
func (db *DB) Engine() Engine { return db.engine }

// Ping checks that the database is reachable.
func (db *DB) Ping(ctx context.Context) error { return db.base.Ping(ctx) }

// Close releases the prepared statements and the connection pool.
func (db *DB) Close() error { return db.base.Close() }

// hotRow runs a query on a request's hot path (narinfo lookups) through a
// statement prepared once: SQLite otherwise parses the SQL on every call,
// which costs more than the lookup itself.
func (db *DB) hotRow(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := db.prepared(ctx, query)
	if err != nil {
		return db.sql.QueryRowContext(ctx, query, args...) // reports the error
	}
	return st.QueryRowContext(ctx, args...)
}

// hotQuery is hotRow for a query of several rows.
func (db *DB) hotQuery(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := db.prepared(ctx, query)
	if err != nil {
		return db.sql.QueryContext(ctx, query, args...) // reports the error
	}
	return st.QueryContext(ctx, args...)
}

// prepared returns the statement for query, prepared once on db.sql
// (sqldb.DB.Prepared).
func (db *DB) prepared(ctx context.Context, query string) (*sql.Stmt, error) {
	return db.base.Prepared(ctx, db.sql, query)
}

// postgresMaxConns bounds the server's PostgreSQL connections.
const postgresMaxConns = sqldb.PostgresMaxConns
