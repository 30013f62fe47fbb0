package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // registers the "sqlite" database/sql driver
)

// Engine names the database engine behind a DB.
type Engine string

const (
	EngineSQLite   Engine = "sqlite"
	EnginePostgres Engine = "postgres"
)

// sqliteFileName is the database file inside a data directory.
const sqliteFileName = "gradient.db"

// DB is the server's database. Both engines go through database/sql with
// one set of queries, so every method behaves the same on either.
type DB struct {
	sql    *sql.DB
	engine Engine

	stmtMu sync.Mutex
	stmts  map[string]*sql.Stmt // hot queries, prepared once (see hotRow)

	// On PostgreSQL, concurrent claims and completions share statements
	// (see batcher); nil on SQLite, which runs one writer at a time.
	claims      *batcher[claimCall, bool]
	completions *batcher[completeCall, completion]

	// writers queues this process's SQLite write transactions in Go.
	// SQLite lets one writer in at a time; the others would wait in its
	// busy handler, which polls with sleeps of up to 100 ms.
	writers sync.Mutex

	// sealer, when set, seals caches' signing keys at rest (SealSecretsWith).
	sealer SecretSealer
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
	target, err := parseTarget(rawURL)
	if err != nil {
		return nil, err
	}
	var db *DB
	switch target.engine {
	case EngineSQLite:
		db, err = openSQLite(target.path)
	case EnginePostgres:
		db, err = openPostgres(target.dsn)
	}
	if err != nil {
		return nil, err
	}
	if err := db.connect(ctx); err != nil {
		db.sql.Close()
		return nil, fmt.Errorf("connect to %s database %s: %w", target.engine, target.display, err)
	}
	if err := db.migrate(ctx); err != nil {
		db.sql.Close()
		return nil, err
	}
	slog.InfoContext(ctx, "database opened", "engine", target.engine, "location", target.display)
	return db, nil
}

// connect opens the first connection. SQLite answers SQLITE_BUSY at once,
// without waiting on busy_timeout, while another process switches a new
// database to WAL mode; that passes within milliseconds, so retry briefly.
func (db *DB) connect(ctx context.Context) error {
	delay := 10 * time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := db.sql.PingContext(ctx)
		if err == nil || db.engine != EngineSQLite || !strings.Contains(err.Error(), "SQLITE_BUSY") || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// Engine reports which database engine db uses.
func (db *DB) Engine() Engine { return db.engine }

// ConcurrentWrites reports whether writes from several goroutines run
// side by side (PostgreSQL) rather than queueing for one writer lock
// (SQLite), where running them concurrently only adds lock waits.
func (db *DB) ConcurrentWrites() bool { return db.engine == EnginePostgres }

// Ping checks that the database is reachable.
func (db *DB) Ping(ctx context.Context) error { return db.sql.PingContext(ctx) }

// Close releases the prepared statements and the connection pool.
func (db *DB) Close() error {
	db.stmtMu.Lock()
	for _, st := range db.stmts {
		st.Close()
	}
	db.stmts = nil
	db.stmtMu.Unlock()
	return db.sql.Close()
}

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

// prepared returns the statement for query, prepared once on db. The
// preparation runs without the lock: it needs a connection of its own,
// and with a bounded pool every connection may belong to a transaction
// waiting for this very statement.
func (db *DB) prepared(ctx context.Context, query string) (*sql.Stmt, error) {
	db.stmtMu.Lock()
	st, ok := db.stmts[query]
	db.stmtMu.Unlock()
	if ok {
		return st, nil
	}
	st, err := db.sql.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	db.stmtMu.Lock()
	defer db.stmtMu.Unlock()
	if first, ok := db.stmts[query]; ok {
		st.Close() // another caller was first
		return first, nil
	}
	if db.stmts == nil {
		db.stmts = map[string]*sql.Stmt{}
	}
	db.stmts[query] = st
	return st, nil
}

type openTarget struct {
	engine  Engine
	path    string // SQLite database file
	dsn     string // PostgreSQL connection URL
	display string // for logs and errors: never contains a password
}

func parseTarget(rawURL string) (openTarget, error) {
	if strings.TrimSpace(rawURL) == "" {
		return openTarget{}, errors.New("storage: empty database URL (want sqlite://, postgres:// or a data directory)")
	}
	scheme, rest, hasScheme := strings.Cut(rawURL, "://")
	if !hasScheme {
		path := filepath.Join(rawURL, sqliteFileName)
		return openTarget{engine: EngineSQLite, path: path, display: path}, nil
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		u, err := url.Parse(rawURL)
		if err != nil {
			// url.Error quotes the input, which may hold a password.
			return openTarget{}, errors.New("storage: malformed postgres URL")
		}
		// The password may sit in the user info or in the query
		// (?password=…): the display keeps neither.
		display := *u
		display.RawQuery = ""
		return openTarget{engine: EnginePostgres, dsn: rawURL, display: display.Redacted()}, nil
	case "sqlite", "sqlite3":
		path, err := sqlitePath(rest)
		if err != nil {
			return openTarget{}, err
		}
		return openTarget{engine: EngineSQLite, path: path, display: path}, nil
	default:
		return openTarget{}, fmt.Errorf("storage: unsupported database URL scheme %q (want sqlite://, postgres:// or a data directory)", scheme)
	}
}

// sqlitePath turns the part after "sqlite://" into a database file path.
func sqlitePath(rest string) (string, error) {
	rest, _, _ = strings.Cut(rest, "?")
	if rest == "" || rest == "/" {
		return "", errors.New("storage: sqlite:// URL without a path")
	}
	if strings.HasSuffix(rest, "/") {
		return filepath.Join(rest, sqliteFileName), nil
	}
	if info, err := os.Stat(rest); err == nil && info.IsDir() {
		return filepath.Join(rest, sqliteFileName), nil
	}
	return filepath.Clean(rest), nil
}

func openSQLite(path string) (*DB, error) {
	if strings.Contains(path, "?") {
		return nil, fmt.Errorf("storage: sqlite path %q may not contain '?'", path)
	}
	// 0700: the database holds signing keys and token hashes.
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create sqlite data directory: %w", err)
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	// BEGIN IMMEDIATE takes the write lock up front, so a transaction that
	// reads then writes waits on busy_timeout instead of failing with
	// SQLITE_BUSY when it would have to upgrade its lock.
	q.Set("_txlock", "immediate")
	// A plain file name, not a file: URI, so '%' and spaces in the path
	// stay literal; the driver strips the query before opening.
	dsn := path + "?" + q.Encode()
	sqlDB, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite database %s: %w", path, err)
	}
	return &DB{sql: sqlDB, engine: EngineSQLite}, nil
}

// postgresMaxConns bounds the server's PostgreSQL connections.
const postgresMaxConns = 32

func openPostgres(dsn string) (*DB, error) {
	// database/sql over pgx's stdlib driver keeps one code path for both
	// engines; nothing here needs pgxpool's extra API (COPY, LISTEN).
	sqlDB, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, errors.New("storage: open postgres database: invalid connection URL")
	}
	// Bounded, and kept open: a reconnect storm queues for connections
	// instead of exceeding the server's max_connections (100 by default),
	// and busy periods reuse connections instead of reopening them.
	sqlDB.SetMaxOpenConns(postgresMaxConns)
	sqlDB.SetMaxIdleConns(postgresMaxConns)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	db := &DB{sql: sqlDB, engine: EnginePostgres}
	db.claims, db.completions = db.newClaimBatcher(), db.newCompletionBatcher()
	return db, nil
}
