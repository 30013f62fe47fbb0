package storage

import (
	"log/slog"
	"os"
	"testing"

	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// Tests run every behaviour on both engines; fresh databases come from
// sqldb/sqldbtest (see there for GRADIENT_TEST_POSTGRES).
type testEngine struct {
	engine Engine
	// freshURL returns the URL of a new, empty database that is removed
	// when the test ends.
	freshURL func(testing.TB) string
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
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		fn(t, Engine(engine), dbURL)
	})
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

var (
	freshSQLiteURL   = sqldbtest.SQLiteURL
	freshPostgresURL = sqldbtest.PostgresURL
)

func TestMain(m *testing.M) {
	// Every test opens databases; their info lines would bury failures.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(sqldbtest.Main(m))
}
