package sqldb

import (
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// things and others are two test schemas that share one database in
// TestTwoSchemasShareADatabase.
var (
	things = Schema{Name: "things-program", Migrations: os.DirFS("testdata/things"),
		Table: "things_migrations", LockKey: 1, SQLiteFile: "things.db"}
	others = Schema{Name: "others-program", Migrations: os.DirFS("testdata/others"),
		Table: "others_migrations", LockKey: 2, SQLiteFile: "things.db"}
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(sqldbtest.Main(m))
}

func openTest(t *testing.T, dbURL string, schema Schema) *DB {
	t.Helper()
	db, err := Open(t.Context(), dbURL, schema)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestParseTarget(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		in      string
		engine  Engine
		path    string // SQLite file, when engine is sqlite
		wantErr string
	}{
		{in: "sqlite:///abs/path/gradient.db", engine: EngineSQLite, path: "/abs/path/gradient.db"},
		{in: "sqlite://relative/dir/x.db", engine: EngineSQLite, path: "relative/dir/x.db"},
		{in: "sqlite:///abs/dir/", engine: EngineSQLite, path: "/abs/dir/gradient.db"},
		{in: "sqlite://" + dir, engine: EngineSQLite, path: filepath.Join(dir, "gradient.db")},
		{in: "/var/lib/gradient", engine: EngineSQLite, path: "/var/lib/gradient/gradient.db"},
		{in: "data", engine: EngineSQLite, path: "data/gradient.db"},
		{in: "postgres://u:pw@localhost/db?sslmode=disable", engine: EnginePostgres},
		{in: "postgresql://localhost/db", engine: EnginePostgres},
		{in: "postgres://u@localhost/db?password=pw&sslmode=disable", engine: EnginePostgres},
		{in: "", wantErr: "empty database URL"},
		{in: "mysql://localhost/db", wantErr: `unsupported database URL scheme "mysql"`},
		{in: "sqlite://", wantErr: "without a path"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTarget(tt.in, "gradient.db")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Engine != tt.engine {
				t.Fatalf("engine = %s, want %s", got.Engine, tt.engine)
			}
			if tt.engine == EngineSQLite && got.path != tt.path {
				t.Fatalf("path = %q, want %q", got.path, tt.path)
			}
			if strings.Contains(got.Display, "pw") {
				t.Fatalf("display %q shows the password", got.Display)
			}
		})
	}
}

func TestParseMigrationName(t *testing.T) {
	tests := []struct {
		file    string
		version int
		name    string
		engine  Engine
		ok      bool
	}{
		{"0001_initial.sql", 1, "initial", "", true},
		{"0012_nar_metadata.postgres.sql", 12, "nar_metadata", EnginePostgres, true},
		{"0012_nar_metadata.sqlite.sql", 12, "nar_metadata", EngineSQLite, true},
		{"0012_nar_metadata.mysql.sql", 0, "", "", false},
		{"1_short.sql", 0, "", "", false},
		{"0000_zero.sql", 0, "", "", false},
		{"0002-dash.sql", 0, "", "", false},
		{"0002_notes.txt", 0, "", "", false},
	}
	for _, tt := range tests {
		m, engine, err := parseMigrationName(tt.file)
		if (err == nil) != tt.ok {
			t.Fatalf("%s: err = %v, want ok=%v", tt.file, err, tt.ok)
		}
		if tt.ok && (m.Version != tt.version || m.Name != tt.name || engine != tt.engine) {
			t.Fatalf("%s: got %d %q %q", tt.file, m.Version, m.Name, engine)
		}
	}
}

func TestPerEngineMigrationReplacesShared(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		db := openTest(t, dbURL, things)
		var got string
		if err := db.SQL().QueryRowContext(t.Context(), `SELECT engine FROM dialect`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != engine || db.Engine() != Engine(engine) {
			t.Fatalf("ran the %s variant on %s (Engine() = %s)", got, engine, db.Engine())
		}
	})
}

func TestConcurrentOpensMigrateOnce(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				db, err := Open(t.Context(), dbURL, things)
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
		db := openTest(t, dbURL, things)
		var rows, distinct int
		if err := db.SQL().QueryRowContext(t.Context(),
			`SELECT COUNT(*), COUNT(DISTINCT version) FROM things_migrations`).Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		if rows != 2 || distinct != 2 {
			t.Fatalf("things_migrations has %d rows (%d versions), want 2", rows, distinct)
		}
		if v, err := db.SchemaVersion(t.Context()); err != nil || v != 2 {
			t.Fatalf("SchemaVersion = %d, %v; want 2", v, err)
		}
	})
}

// The server and the proxy may share one database: each schema keeps its
// own migrations table, so neither takes the other's versions for its own.
func TestTwoSchemasShareADatabase(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		openTest(t, dbURL, things).Close()
		db := openTest(t, dbURL, others)
		if v, err := db.SchemaVersion(t.Context()); err != nil || v != 1 {
			t.Fatalf("others' SchemaVersion = %d, %v; want 1", v, err)
		}
		if _, err := db.Exec(t.Context(), `INSERT INTO others (id) VALUES ('x')`); err != nil {
			t.Fatalf("others' migration did not run: %v", err)
		}
		if again := openTest(t, dbURL, things); again.Engine() != Engine(engine) {
			t.Fatal("engine changed")
		}
	})
}

func TestNewerSchemaIsRefusedNamingTheProgram(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		db := openTest(t, dbURL, things)
		if _, err := db.Exec(t.Context(),
			`INSERT INTO things_migrations (version, name, applied_at) VALUES (9999, 'future', 0)`); err != nil {
			t.Fatal(err)
		}
		db.Close()
		again, err := Open(t.Context(), dbURL, things)
		if err == nil {
			again.Close()
			t.Fatal("Open accepted a schema newer than the program")
		}
		if !strings.Contains(err.Error(), "upgrade the things-program") {
			t.Fatalf("err = %v, want it to name the program", err)
		}
	})
}

func TestBadSchemaIsRefused(t *testing.T) {
	bad := things
	bad.Table = "x; DROP TABLE things"
	if _, err := Open(t.Context(), sqldbtest.SQLiteURL(t), bad); err == nil {
		t.Fatal("a table name that is not an identifier was accepted")
	}
}

// Both engines' driver errors classify the same, so stores map them to
// the same ErrConflict or ErrInvalid.
func TestConstraintOfOnBothEngines(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		db := openTest(t, dbURL, things)
		ctx := t.Context()
		if _, err := db.Exec(ctx, `INSERT INTO things (id, name) VALUES ('a', 'one')`); err != nil {
			t.Fatal(err)
		}
		for want, query := range map[Constraint]string{
			UniqueViolation:     `INSERT INTO things (id, name) VALUES ('b', 'one')`,
			ForeignKeyViolation: `INSERT INTO parts (thing_id, part) VALUES ('missing', 'p')`,
			CheckViolation:      `INSERT INTO things (id, name) VALUES ('c', '')`,
		} {
			_, err := db.Exec(ctx, query)
			if got := ConstraintOf(err); got != want {
				t.Errorf("%s: ConstraintOf(%v) = %d, want %d", query, err, got, want)
			}
		}
		if got := ConstraintOf(errors.New("other")); got != NoConstraint {
			t.Fatalf("a plain error classified as %d", got)
		}
	})
}

func TestInTxRollsBackOnError(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		db := openTest(t, dbURL, things)
		ctx := t.Context()
		boom := errors.New("boom")
		err := db.InTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO things (id, name) VALUES ('a', 'one')`); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("InTx = %v, want boom", err)
		}
		if found, err := Exists(ctx, db.SQL(), `SELECT 1 FROM things`); err != nil || found {
			t.Fatalf("row kept after rollback (found=%v, err=%v)", found, err)
		}
	})
}

func TestSQLiteDataDirectoryUsesTheSchemasFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	openTest(t, dir, things)
	if _, err := os.Stat(filepath.Join(dir, "things.db")); err != nil {
		t.Fatal(err)
	}
}
