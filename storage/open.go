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
	keyed  *sql.DB   // base's pool for statements that go by key (claims, completions)
	engine Engine

	stmtMu sync.Mutex
	stmts  map[stmtKey]*sql.Stmt // hot queries, prepared once (see hotRow)

	// On PostgreSQL, concurrent claims and completions share statements
	// (see batcher); nil on SQLite, which runs one writer at a time.
	claims      *batcher[claimCall, bool]
	completions *batcher[completeCall, completion]
	// Narinfo rows of concurrent upload commits share a transaction
	// (putCachePaths), on either engine.
	cachePaths *batcher[cachePathPut, cachePathPut]

	// sealer, when set, seals caches' signing keys at rest (SealSecretsWith).
	sealer SecretSealer

	// channel is the worker sessions' notification channel, named once
	// (sessionsChannel).
	channelMu sync.Mutex
	channel   string

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
	db := &DB{base: base, sql: base.SQL(), keyed: base.Keyed(), engine: base.Engine()}
	db.cachePaths = db.newCachePathBatcher()
	if db.engine == EnginePostgres {
		// On PostgreSQL, concurrent claims and completions share
		// statements; SQLite runs one writer at a time.
		db.claims, db.completions = db.newClaimBatcher(), db.newCompletionBatcher()
	}
	return db, nil
}

// Engine reports which database engine db uses.
func (db *DB) Engine() Engine { return db.engine }

// ConcurrentWrites reports whether writes from several goroutines run
// side by side (PostgreSQL) rather than queueing for one writer lock
// (SQLite), where running them concurrently only adds lock waits.
func (db *DB) ConcurrentWrites() bool { return db.engine == EnginePostgres }

// Ping checks that the database is reachable.
func (db *DB) Ping(ctx context.Context) error { return db.base.Ping(ctx) }

// Close releases the prepared statements and the connection pool.
func (db *DB) Close() error {
	db.stmtMu.Lock()
	for _, st := range db.stmts {
		st.Close()
	}
	db.stmts = nil
	db.stmtMu.Unlock()
	return db.base.Close()
}

// hotRow runs a query on a request's hot path (narinfo lookups) through a
// statement prepared once: SQLite otherwise parses the SQL on every call,
// which costs more than the lookup itself.
func (db *DB) hotRow(ctx context.Context, query string, args ...any) *sql.Row {
	return db.hotRowOn(ctx, db.sql, query, args...)
}

// keyedRow is hotRow on the keyed pool (sqldb.DB.Keyed), for statements
// whose plans must go by key however small their tables were when the
// plan was made.
func (db *DB) keyedRow(ctx context.Context, query string, args ...any) *sql.Row {
	return db.hotRowOn(ctx, db.keyed, query, args...)
}

func (db *DB) hotRowOn(ctx context.Context, pool *sql.DB, query string, args ...any) *sql.Row {
	st, err := db.preparedOn(ctx, pool, query)
	if err != nil {
		return pool.QueryRowContext(ctx, query, args...) // reports the error
	}
	return st.QueryRowContext(ctx, args...)
}

// stmtKey names a prepared statement: its pool and its query.
type stmtKey struct {
	pool  *sql.DB
	query string
}

// hotQuery is hotRow for a query of several rows.
func (db *DB) hotQuery(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := db.prepared(ctx, query)
	if err != nil {
		return db.sql.QueryContext(ctx, query, args...) // reports the error
	}
	return st.QueryContext(ctx, args...)
}

// prepared returns the statement for query, prepared once on db. The
// preparation runs without the lock: it needs a connection of its own,
// and with a bounded pool every connection may belong to a transaction
// waiting for this very statement.
func (db *DB) prepared(ctx context.Context, query string) (*sql.Stmt, error) {
	return db.preparedOn(ctx, db.sql, query)
}

// preparedOn is prepared on a pool of db: db.sql or db.keyed.
func (db *DB) preparedOn(ctx context.Context, pool *sql.DB, query string) (*sql.Stmt, error) {
	key := stmtKey{pool, query}
	db.stmtMu.Lock()
	st, ok := db.stmts[key]
	db.stmtMu.Unlock()
	if ok {
		return st, nil
	}
	st, err := pool.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	db.stmtMu.Lock()
	defer db.stmtMu.Unlock()
	if first, ok := db.stmts[key]; ok {
		st.Close() // another caller was first
		return first, nil
	}
	if db.stmts == nil {
		db.stmts = map[stmtKey]*sql.Stmt{}
	}
	db.stmts[key] = st
	return st, nil
}

// postgresMaxConns bounds the server's PostgreSQL connections.
const postgresMaxConns = sqldb.PostgresMaxConns
