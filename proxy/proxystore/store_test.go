package proxystore

import (
	"log/slog"
	"os"
	"testing"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

func TestMain(m *testing.M) {
	// Every test opens databases; their info lines would bury failures.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(sqldbtest.Main(m))
}

func newBox(t *testing.T) *sealbox.Box {
	t.Helper()
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	return box
}

func openStore(t *testing.T, dbURL string, box *sealbox.Box) *Store {
	t.Helper()
	s, err := Open(t.Context(), dbURL, box)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// forEachEngine runs fn as a parallel subtest per engine with a fresh
// store, its URL and its key.
func forEachEngine(t *testing.T, fn func(t *testing.T, s *Store, dbURL string, box *sealbox.Box)) {
	t.Helper()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		box := newBox(t)
		s := openStore(t, dbURL, box)
		if string(s.Engine()) != engine {
			t.Fatalf("engine %s, want %s", s.Engine(), engine)
		}
		fn(t, s, dbURL, box)
	})
}

func TestOpenNeedsAKey(t *testing.T) {
	if s, err := Open(t.Context(), sqldbtest.SQLiteURL(t), nil); err == nil {
		s.Close()
		t.Fatal("Open without an encryption key succeeded")
	}
}

func TestReopenKeepsDataAndMigratesOnce(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, dbURL string, box *sealbox.Box) {
		if _, err := s.CreateTenant(t.Context(), "kept"); err != nil {
			t.Fatal(err)
		}
		s.Close()
		again := openStore(t, dbURL, box)
		if _, err := again.Tenant(t.Context(), "kept"); err != nil {
			t.Fatalf("data lost on reopen: %v", err)
		}
		var rows int
		if err := again.sql.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM proxy_schema_migrations`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		migrations, err := sqldb.LoadMigrations(schema, again.Engine())
		if err != nil {
			t.Fatal(err)
		}
		if rows != len(migrations) {
			t.Fatalf("proxy_schema_migrations has %d rows, want one per migration (%d)", rows, len(migrations))
		}
	})
}

// An operator may point the proxy at the server's database: the two
// schemas keep their own tables, migrations tables and locks.
func TestSharesADatabaseWithTheServer(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, dbURL string, box *sealbox.Box) {
		server, err := storage.Open(t.Context(), dbURL)
		if err != nil {
			t.Fatalf("the server's storage on the proxy's database: %v", err)
		}
		defer server.Close()
		if _, err := server.CreateTeam(t.Context(), "team"); err != nil {
			t.Fatal(err)
		}
		s.Close()
		again := openStore(t, dbURL, box)
		if _, err := again.CreateTenant(t.Context(), "tenant"); err != nil {
			t.Fatalf("the proxy's store beside the server's schema: %v", err)
		}
	})
}
