// Package sqldbtest makes fresh, empty databases for tests: SQLite in a
// temporary directory, and a schema of its own in one PostgreSQL database
// per test run. It imports neither sqldb nor storage, so the tests of
// sqldb, storage, storagetest (for every other package) and the proxy's
// store share it.
//
// PostgreSQL comes from GRADIENT_TEST_POSTGRES (a maintenance database the
// user may CREATE DATABASE through), by default the local trust-auth
// server. An unreachable server fails the test unless
// GRADIENT_TEST_SKIP_POSTGRES=1.
package sqldbtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

const defaultPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// SQLiteURL is a new SQLite database in the test's temporary directory.
func SQLiteURL(t testing.TB) string {
	return "sqlite://" + filepath.Join(t.TempDir(), "gradient.db")
}

// Engine is one database engine tests run on: its name (as sqldb.Engine
// spells it) and the maker of fresh database URLs.
type Engine struct {
	Name string
	// FreshURL returns the URL of a new, empty database that is removed
	// when the test ends.
	FreshURL func(testing.TB) string
}

// Engines are the engines every behaviour is tested on.
var Engines = []Engine{{"sqlite", SQLiteURL}, {"postgres", PostgresURL}}

// ForEachEngineURL runs fn as a parallel subtest per engine with the URL
// of a fresh database. Callers should be parallel tests too: the
// PostgreSQL round trips dominate the run time, not the CPU.
func ForEachEngineURL(t *testing.T, fn func(t *testing.T, engine, dbURL string)) {
	t.Helper()
	for _, e := range Engines {
		t.Run(e.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, e.Name, e.FreshURL(t))
		})
	}
}

var run struct {
	once  sync.Once
	err   error
	base  string
	name  string
	admin *sql.DB
}

// Main runs the tests and drops this run's PostgreSQL database afterwards;
// call it from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	if err := Drop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Drop removes this run's PostgreSQL database, if one was made.
func Drop() error {
	if run.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		defer run.admin.Close()
		if _, err := run.admin.ExecContext(ctx, `DROP DATABASE IF EXISTS `+run.name+` WITH (FORCE)`); err != nil {
			return fmt.Errorf("drop test database %s: %w", run.name, err)
		}
	}
	return nil
}

func createDatabase() error {
	run.base = os.Getenv("GRADIENT_TEST_POSTGRES")
	if run.base == "" {
		run.base = defaultPostgres
	}
	admin, err := sql.Open("pgx", run.base)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		admin.Close()
		return err
	}
	name := "gradient_test_" + randomHex()
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE `+name); err != nil {
		admin.Close()
		return fmt.Errorf("create test database: %w", err)
	}
	run.admin, run.name = admin, name
	return nil
}

// PostgresURL is a new, empty schema in this run's test database, dropped
// when the test ends. An unreachable server fails the test unless
// GRADIENT_TEST_SKIP_POSTGRES=1.
func PostgresURL(tb testing.TB) string {
	return postgresSchema(tb, os.Getenv("GRADIENT_TEST_SKIP_POSTGRES") == "1")
}

// PostgresURLOrSkip is PostgresURL for benchmarks: an unreachable server
// skips instead of failing.
func PostgresURLOrSkip(tb testing.TB) string { return postgresSchema(tb, true) }

func postgresSchema(tb testing.TB, skipIfDown bool) string {
	tb.Helper()
	run.once.Do(func() { run.err = createDatabase() })
	if run.err != nil {
		if skipIfDown {
			tb.Skipf("PostgreSQL unreachable: %v", run.err)
		}
		tb.Fatalf("PostgreSQL is unavailable (start it, or set GRADIENT_TEST_SKIP_POSTGRES=1): %v", run.err)
	}
	u, err := url.Parse(run.base)
	if err != nil {
		tb.Fatal(err)
	}
	u.Path = "/" + run.name
	schema := "t_" + randomHex()
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	conn, err := sql.Open("pgx", u.String())
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.ExecContext(tb.Context(), `CREATE SCHEMA `+schema); err != nil {
		conn.Close()
		tb.Fatalf("create test schema: %v", err)
	}
	// Registered before the caller opens the schema, so it runs after the
	// caller's Close (cleanups run last-in first-out).
	tb.Cleanup(func() {
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			tb.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	return u.String()
}

func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
