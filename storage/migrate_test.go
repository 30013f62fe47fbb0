package storage

import (
	"gradient.dev/gradient/storage/sqldb"
	"sync"
	"testing"
)

func TestMigrationsAreIdempotent(t *testing.T) {
	t.Parallel()
	forEachEngineURL(t, func(t *testing.T, engine Engine, dbURL string) {
		migrations, err := sqldb.LoadMigrations(schema, engine)
		if err != nil {
			t.Fatal(err)
		}
		first := openTestDB(t, dbURL)
		if _, err := first.CreateTeam(t.Context(), "kept"); err != nil {
			t.Fatal(err)
		}
		first.Close()

		second := openTestDB(t, dbURL)
		assertMigratedOnce(t, second, len(migrations))
		if _, err := second.TeamByName(t.Context(), "kept"); err != nil {
			t.Fatalf("data lost on reopen: %v", err)
		}
		version, err := second.SchemaVersion(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if want := migrations[len(migrations)-1].Version; version != want {
			t.Fatalf("schema version %d, want %d", version, want)
		}
	})
}

func TestConcurrentOpensMigrateOnce(t *testing.T) {
	t.Parallel()
	forEachEngineURL(t, func(t *testing.T, engine Engine, dbURL string) {
		migrations, err := sqldb.LoadMigrations(schema, engine)
		if err != nil {
			t.Fatal(err)
		}
		const servers = 4
		var wg sync.WaitGroup
		errs := make(chan error, servers)
		for range servers {
			wg.Go(func() {
				db, err := Open(t.Context(), dbURL)
				if err == nil {
					db.Close()
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent Open: %v", err)
			}
		}
		assertMigratedOnce(t, openTestDB(t, dbURL), len(migrations))
	})
}

func assertMigratedOnce(t *testing.T, db *DB, want int) {
	t.Helper()
	var rows, distinct int
	err := db.sql.QueryRowContext(t.Context(),
		`SELECT COUNT(*), COUNT(DISTINCT version) FROM schema_migrations`).Scan(&rows, &distinct)
	if err != nil {
		t.Fatal(err)
	}
	if rows != want || distinct != want {
		t.Fatalf("schema_migrations has %d rows (%d versions), want %d", rows, distinct, want)
	}
}

func TestNewerSchemaIsRefused(t *testing.T) {
	t.Parallel()
	forEachEngineURL(t, func(t *testing.T, engine Engine, dbURL string) {
		db := openTestDB(t, dbURL)
		if _, err := db.sql.ExecContext(t.Context(),
			`INSERT INTO schema_migrations (version, name, applied_at) VALUES (9999, 'future', 0)`); err != nil {
			t.Fatal(err)
		}
		db.Close()
		if again, err := Open(t.Context(), dbURL); err == nil {
			again.Close()
			t.Fatal("Open accepted a schema newer than the server")
		}
	})
}

func TestEmbeddedMigrationsAreNumberedFromOneWithoutGaps(t *testing.T) {
	for _, engine := range []Engine{EngineSQLite, EnginePostgres} {
		migrations, err := sqldb.LoadMigrations(schema, engine)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range migrations {
			if m.Version != i+1 {
				t.Fatalf("%s: migration %d has version %d", engine, i, m.Version)
			}
		}
	}
}
