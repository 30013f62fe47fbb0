package storage

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
			got, err := parseTarget(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.engine != tt.engine {
				t.Fatalf("engine = %s, want %s", got.engine, tt.engine)
			}
			if tt.engine == EngineSQLite && got.path != tt.path {
				t.Fatalf("path = %q, want %q", got.path, tt.path)
			}
			if strings.Contains(got.display, "pw") {
				t.Fatalf("display %q shows the password", got.display)
			}
		})
	}
}

func TestOpenDataDirectoryCreatesIt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "gradient")
	db := openTestDB(t, dir)
	if db.Engine() != EngineSQLite {
		t.Fatalf("engine = %s", db.Engine())
	}
	if _, err := os.Stat(filepath.Join(dir, "gradient.db")); err != nil {
		t.Fatal(err)
	}
}

func TestOpenSQLitePathWithSpaceAndPercent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a b%41c")
	openTestDB(t, "sqlite://"+dir+"/")
	if _, err := os.Stat(filepath.Join(dir, "gradient.db")); err != nil {
		t.Fatal(err)
	}
}

func TestOpenUnknownSchemeFails(t *testing.T) {
	_, err := Open(t.Context(), "redis://localhost")
	if err == nil || !strings.Contains(err.Error(), "unsupported") {
		t.Fatalf("err = %v", err)
	}
}

func TestOpenUnreachablePostgresFailsWithoutPassword(t *testing.T) {
	_, err := Open(t.Context(), "postgres://u:hunter2@127.0.0.1:1/db?sslmode=disable&connect_timeout=2")
	if err == nil {
		t.Fatal("Open succeeded")
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error shows the password: %v", err)
	}
}

func TestSQLitePragmas(t *testing.T) {
	db := openTestDB(t, freshSQLiteURL(t))
	var mode string
	var fk, busy int
	ctx := t.Context()
	if err := db.sql.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if err := db.sql.QueryRowContext(ctx, `PRAGMA foreign_keys`).Scan(&fk); err != nil {
		t.Fatal(err)
	}
	if err := db.sql.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || fk != 1 || busy <= 0 {
		t.Fatalf("journal_mode=%s foreign_keys=%d busy_timeout=%d, want wal, 1, > 0", mode, fk, busy)
	}
}

// The queries are written once with $N placeholders; SQLite must bind
// them by position, including one placeholder used twice.
func TestDollarPlaceholdersOnBothEngines(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		var a, b string
		var same bool
		err := db.sql.QueryRowContext(t.Context(), `SELECT $2, $1, $2 = $1`, "one", "two").Scan(&a, &b, &same)
		if err != nil {
			t.Fatal(err)
		}
		if a != "two" || b != "one" || same {
			t.Fatalf("got %q %q", a, b)
		}
	})
}

func TestErrorsAreTyped(t *testing.T) {
	for _, err := range []error{notFound("x %d", 1), conflict("y"), invalid("z")} {
		if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrInvalid) {
			t.Fatalf("%v wraps no typed error", err)
		}
	}
}
