package storage

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
