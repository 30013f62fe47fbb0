package sqldb

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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // also registers the "pgx" database/sql driver
	_ "modernc.org/sqlite"           // registers the "sqlite" database/sql driver
)

// Engine names the database engine behind a DB.
type Engine string

const (
	EngineSQLite   Engine = "sqlite"
	EnginePostgres Engine = "postgres"
)

// PostgresMaxConns bounds a process's PostgreSQL connections of the main
// pool (SQL); Keyed has keyedMaxConns more.
const PostgresMaxConns = 32

// DB is one opened, migrated database. Both engines go through
// database/sql with one set of queries.
type DB struct {
	sql    *sql.DB
	keyed  *sql.DB // see Keyed; sql itself on SQLite
	engine Engine
	schema Schema

	// writers queues this process's SQLite write transactions in Go.
	// SQLite lets one writer in at a time; the others would wait in its
	// busy handler, which polls with sleeps of up to 100 ms.
	writers sync.Mutex

	stmtMu sync.Mutex
	stmts  map[stmtKey]*sql.Stmt // hot queries, prepared once (Prepared)
}

// Open connects to the database at rawURL and applies schema's pending
// migrations.
//
// Accepted forms:
//
//	postgres://user@host:5432/db?sslmode=disable  (also postgresql://)
//	sqlite:///abs/path/gradient.db                 an absolute database file
//	sqlite://relative/dir/gradient.db              a file relative to the working directory
//	sqlite:///abs/dir/  or  /var/lib/gradient      a data directory: <dir>/<schema.SQLiteFile>
//
// A plain path without a scheme is always a data directory. A sqlite://
// path naming an existing directory, or ending in '/', is one too.
func Open(ctx context.Context, rawURL string, schema Schema) (*DB, error) {
	if err := schema.check(); err != nil {
		return nil, err
	}
	target, err := ParseTarget(rawURL, schema.SQLiteFile)
	if err != nil {
		return nil, err
	}
	var db *DB
	switch target.Engine {
	case EngineSQLite:
		db, err = openSQLite(target.path)
	case EnginePostgres:
		db, err = openPostgres(target.dsn)
	}
	if err != nil {
		return nil, err
	}
	if err := db.connect(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to %s database %s: %w", target.Engine, target.Display, err)
	}
	db.schema = schema
	if err := db.migrate(ctx, schema); err != nil {
		db.Close()
		return nil, err
	}
	slog.InfoContext(ctx, "database opened", "schema", schema.Name, "engine", target.Engine, "location", target.Display)
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

// SQL is the connection pool, for the queries of the package above.
func (db *DB) SQL() *sql.DB { return db.sql }

// Keyed is a small pool for statements that only ever look rows up by
// key, whatever the sizes of their tables: on PostgreSQL its connections
// plan without sequential scans, hash or merge joins (KeyedSettings). A
// prepared statement's generic plan is made once, for the table sizes of
// that moment: one made while the job tables were nearly empty scans them
// and hash-joins, and keeps doing so after they have grown to 100,000
// rows, until an ANALYZE invalidates it. On SQLite it is SQL.
func (db *DB) Keyed() *sql.DB { return db.keyed }

// KeyedSettings are the planner settings of Keyed's connections.
var KeyedSettings = map[string]string{"enable_seqscan": "off", "enable_hashjoin": "off", "enable_mergejoin": "off"}

// keyedMaxConns bounds Keyed's connections: its statements are few at a
// time (the claim and completion batchers run two each, and the
// scheduler reads newly pending jobs by ID after a completion).
const keyedMaxConns = 6

// Engine reports which database engine db uses.
func (db *DB) Engine() Engine { return db.engine }

// Ping checks that the database is reachable.
func (db *DB) Ping(ctx context.Context) error { return db.sql.PingContext(ctx) }

// Close releases the prepared statements and the connection pools.
func (db *DB) Close() error {
	db.closeStatements()
	err := db.sql.Close()
	if db.keyed != db.sql {
		err = errors.Join(err, db.keyed.Close())
	}
	return err
}

// Target is a parsed database URL.
type Target struct {
	Engine  Engine
	Display string // for logs and errors: never contains a password
	path    string // SQLite database file
	dsn     string // PostgreSQL connection URL
}

// ParseTarget reads a database URL in one of Open's forms; sqliteFile is
// the database file inside a data directory.
func ParseTarget(rawURL, sqliteFile string) (Target, error) {
	if strings.TrimSpace(rawURL) == "" {
		return Target{}, errors.New("storage: empty database URL (want sqlite://, postgres:// or a data directory)")
	}
	scheme, rest, hasScheme := strings.Cut(rawURL, "://")
	if !hasScheme {
		path := filepath.Join(rawURL, sqliteFile)
		return Target{Engine: EngineSQLite, path: path, Display: path}, nil
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		u, err := url.Parse(rawURL)
		if err != nil {
			// url.Error quotes the input, which may hold a password.
			return Target{}, errors.New("storage: malformed postgres URL")
		}
		// The password may sit in the user info or in the query
		// (?password=…): the display keeps neither.
		display := *u
		display.RawQuery = ""
		return Target{Engine: EnginePostgres, dsn: rawURL, Display: display.Redacted()}, nil
	case "sqlite", "sqlite3":
		path, err := sqlitePath(rest, sqliteFile)
		if err != nil {
			return Target{}, err
		}
		return Target{Engine: EngineSQLite, path: path, Display: path}, nil
	default:
		return Target{}, fmt.Errorf("storage: unsupported database URL scheme %q (want sqlite://, postgres:// or a data directory)", scheme)
	}
}

// sqlitePath turns the part after "sqlite://" into a database file path.
func sqlitePath(rest, sqliteFile string) (string, error) {
	rest, _, _ = strings.Cut(rest, "?")
	if rest == "" || rest == "/" {
		return "", errors.New("storage: sqlite:// URL without a path")
	}
	if strings.HasSuffix(rest, "/") {
		return filepath.Join(rest, sqliteFile), nil
	}
	if info, err := os.Stat(rest); err == nil && info.IsDir() {
		return filepath.Join(rest, sqliteFile), nil
	}
	return filepath.Clean(rest), nil
}

func openSQLite(path string) (*DB, error) {
	if strings.Contains(path, "?") {
		return nil, fmt.Errorf("storage: sqlite path %q may not contain '?'", path)
	}
	// 0700: the database holds signing keys, sealed tokens and token hashes.
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
	// Concurrent readers (every upload's grant looks its path up) open
	// connections beyond database/sql's default of two idle ones; each
	// closed one is reopened later, running the pragmas, reading the
	// schema and preparing its statements again.
	sqlDB.SetMaxIdleConns(sqliteIdleConns)
	return &DB{sql: sqlDB, keyed: sqlDB, engine: EngineSQLite}, nil
}

// sqliteIdleConns is how many SQLite connections stay open when idle.
const sqliteIdleConns = 8

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
	sqlDB.SetMaxOpenConns(PostgresMaxConns)
	sqlDB.SetMaxIdleConns(PostgresMaxConns)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	config, err := pgx.ParseConfig(dsn)
	if err != nil {
		sqlDB.Close()
		return nil, errors.New("storage: open postgres database: invalid connection URL")
	}
	for k, v := range KeyedSettings {
		config.RuntimeParams[k] = v
	}
	keyed := stdlib.OpenDB(*config)
	keyed.SetMaxOpenConns(keyedMaxConns)
	keyed.SetMaxIdleConns(keyedMaxConns)
	keyed.SetConnMaxIdleTime(5 * time.Minute)
	return &DB{sql: sqlDB, keyed: keyed, engine: EnginePostgres}, nil
}
