package storage

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Tests run every behaviour on both engines. PostgreSQL comes from
// GRADIENT_TEST_POSTGRES (a URL of a maintenance database the test user
// may CREATE DATABASE through), by default the local trust-auth server;
// each run creates its own gradient_test_<random> database.
// An unreachable server fails the tests unless GRADIENT_TEST_SKIP_POSTGRES=1.
const defaultTestPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

type testEngine struct {
	engine Engine
	// freshURL returns the URL of a new, empty database that is removed
	// when the test ends.
	freshURL func(t *testing.T) string
}

var testEngines = []testEngine{
	{EngineSQLite, freshSQLiteURL},
	{EnginePostgres, freshPostgresURL},
}

// forEachEngine runs fn as a parallel subtest per engine, each with a
// fresh database. Callers should be parallel tests too: the PostgreSQL
// round trips dominate the run time, not the CPU.
func forEachEngine(t *testing.T, fn func(t *testing.T, db *DB)) {
	t.Helper()
	for _, e := range testEngines {
		t.Run(string(e.engine), func(t *testing.T) {
			t.Parallel()
			fn(t, openTestDB(t, e.freshURL(t)))
		})
	}
}

// forEachEngineURL runs fn per engine with the URL of a fresh database.
func forEachEngineURL(t *testing.T, fn func(t *testing.T, engine Engine, dbURL string)) {
	t.Helper()
	for _, e := range testEngines {
		t.Run(string(e.engine), func(t *testing.T) {
			t.Parallel()
			fn(t, e.engine, e.freshURL(t))
		})
	}
}

func openTestDB(t *testing.T, dbURL string) *DB {
	t.Helper()
	db, err := Open(t.Context(), dbURL)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func freshSQLiteURL(t *testing.T) string {
	return "sqlite://" + filepath.Join(t.TempDir(), "gradient.db")
}

// testPostgres is the one database this test run creates; each test gets
// its own schema in it (selected through search_path), which is much
// faster than a database per test. TestMain drops the database.
var testPostgres struct {
	once  sync.Once
	err   error
	base  string // maintenance database URL
	name  string // this run's database
	admin *sql.DB
}

func testPostgresBase() string {
	if v := os.Getenv("GRADIENT_TEST_POSTGRES"); v != "" {
		return v
	}
	return defaultTestPostgres
}

func TestMain(m *testing.M) {
	// Every test opens databases; their info lines would bury failures.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	code := m.Run()
	if err := dropTestPostgres(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func createTestPostgres() error {
	testPostgres.base = testPostgresBase()
	admin, err := sql.Open("pgx", testPostgres.base)
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
	testPostgres.admin, testPostgres.name = admin, name
	return nil
}

func dropTestPostgres() error {
	if testPostgres.admin == nil {
		return nil
	}
	defer testPostgres.admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := testPostgres.admin.ExecContext(ctx, `DROP DATABASE IF EXISTS `+testPostgres.name+` WITH (FORCE)`); err != nil {
		return fmt.Errorf("drop test database %s: %w", testPostgres.name, err)
	}
	return nil
}

// freshPostgresURL returns the URL of a new, empty schema in this run's
// test database; the schema is dropped when the test ends.
func freshPostgresURL(t *testing.T) string {
	t.Helper()
	testPostgres.once.Do(func() { testPostgres.err = createTestPostgres() })
	if err := testPostgres.err; err != nil {
		if os.Getenv("GRADIENT_TEST_SKIP_POSTGRES") == "1" {
			t.Skipf("PostgreSQL unreachable and GRADIENT_TEST_SKIP_POSTGRES=1: %v", err)
		}
		t.Fatalf("PostgreSQL at %s is unavailable (start it, or set GRADIENT_TEST_SKIP_POSTGRES=1): %v",
			redacted(testPostgres.base), err)
	}
	u, err := url.Parse(testPostgres.base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + testPostgres.name
	schema := "t_" + randomHex()
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	dbURL := u.String()

	conn, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(t.Context(), `CREATE SCHEMA `+schema); err != nil {
		conn.Close()
		t.Fatalf("create test schema: %v", err)
	}
	// Registered before the test opens the schema, so it runs after the
	// test's Close calls (cleanups run last-in first-out).
	t.Cleanup(func() {
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	return dbURL
}

func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
