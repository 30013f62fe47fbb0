// Package storagetest gives tests of other packages a fresh, migrated
// database on each engine: SQLite in a temporary directory, and a schema of
// its own in one PostgreSQL database per test run.
//
// PostgreSQL comes from GRADIENT_TEST_POSTGRES (a maintenance database the
// user may CREATE DATABASE through), by default the local trust-auth
// server. An unreachable server fails the test unless
// GRADIENT_TEST_SKIP_POSTGRES=1.
package storagetest

import (
	"testing"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// ForEachEngine runs fn as a parallel subtest per engine, each with a
// fresh, migrated database that is closed when the subtest ends.
func ForEachEngine(t *testing.T, fn func(t *testing.T, db *storage.DB)) {
	t.Helper()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		db, err := storage.Open(t.Context(), dbURL)
		if err != nil {
			t.Fatalf("open %s: %v", engine, err)
		}
		t.Cleanup(func() { db.Close() })
		fn(t, db)
	})
}

// SQLiteURL is a new SQLite database in the test's temporary directory.
func SQLiteURL(t testing.TB) string { return sqldbtest.SQLiteURL(t) }

// Main runs the tests and drops this run's PostgreSQL database afterwards;
// call it from TestMain.
func Main(m *testing.M) int { return sqldbtest.Main(m) }

// PostgresURL is a new, empty PostgreSQL schema for the test, dropped
// when it ends; other processes (a server under test) may open it too.
func PostgresURL(tb testing.TB) string { return sqldbtest.PostgresURL(tb) }

// PostgresURLOrSkip is PostgresURL for benchmarks: an unreachable server
// skips instead of failing.
func PostgresURLOrSkip(tb testing.TB) string { return sqldbtest.PostgresURLOrSkip(tb) }
