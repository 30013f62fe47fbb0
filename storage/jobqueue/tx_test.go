package jobqueue

import (
	"database/sql"
	"testing"
)

// Queued work is committed with a full sync on SQLite; the pool's
// connections stay at NORMAL for the job loop's hot writes.
func TestDurableJobTxSyncsOnSQLite(t *testing.T) {
	t.Parallel()
	db := openTestDB(t, freshSQLiteURL(t))
	db.sql.SetMaxOpenConns(1) // one connection: the one the transaction used
	var inside int
	if err := db.durableJobTx(t.Context(), func(tx *sql.Tx) error {
		return tx.QueryRowContext(t.Context(), `PRAGMA synchronous`).Scan(&inside)
	}); err != nil {
		t.Fatal(err)
	}
	var after int
	if err := db.sql.QueryRowContext(t.Context(), `PRAGMA synchronous`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if inside != 2 || after != 1 {
		t.Fatalf("synchronous %d inside the transaction, %d after; want 2 (FULL), then 1 (NORMAL)", inside, after)
	}
}
