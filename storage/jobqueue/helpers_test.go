package jobqueue

import (
	"log/slog"
	"os"
	"testing"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// testDB is a database with its queue: tests call the queue's methods and
// storage's (projects, caches) on one value.
type testDB struct {
	*Queue
	*storage.DB
}

// forEachEngine runs fn as a parallel subtest per engine, each with a
// fresh database (sqldb/sqldbtest; see there for GRADIENT_TEST_POSTGRES).
func forEachEngine(t *testing.T, fn func(t *testing.T, db *testDB)) {
	t.Helper()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		fn(t, openTestDB(t, dbURL))
	})
}

func openTestDB(t testing.TB, dbURL string) *testDB {
	t.Helper()
	db, err := storage.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return &testDB{New(db), db}
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

func mustTeam(t *testing.T, db *testDB, name string) storage.Team {
	t.Helper()
	team, err := db.CreateTeam(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return team
}

func mustProject(t *testing.T, db *testDB, teamID, name string) storage.Project {
	t.Helper()
	p, err := db.CreateProject(t.Context(), storage.NewProject{
		TeamID: teamID, Name: name, Repository: "git+https://example.com/" + name, Branch: "main",
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustCache(t *testing.T, db *testDB, name string) storage.Cache {
	t.Helper()
	c, err := db.CreateCache(t.Context(), storage.NewCache{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
