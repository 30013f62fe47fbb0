package storage

import (
	"context"
	"database/sql"

	"gradient.dev/gradient/storage/sqldb"
)

// inTx runs fn in a transaction, committing when fn returns nil; on
// SQLite it queues for the one writer (sqldb.DB.InTx).
func (db *DB) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return db.base.InTx(ctx, fn)
}

// jobTx is inTx retried after a deadlock or serialization failure
// (sqldb.DB.InTxRetrying).
func (db *DB) jobTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return db.base.InTxRetrying(ctx, fn)
}

// runTx runs fn in tx, which BeginTx returned with err, and commits when
// fn returns nil, else rolls back.
func runTx(tx *sql.Tx, err error, fn func(tx *sql.Tx) error) error { return sqldb.RunTx(tx, err, fn) }

// querier is what *sql.DB and *sql.Tx share, so a read helper can run
// inside or outside a transaction.
type querier = sqldb.Querier

// exists reports whether query returns at least one row.
func exists(ctx context.Context, q querier, query string, args ...any) (bool, error) {
	return sqldb.Exists(ctx, q, query, args...)
}

// collect scans every row of rows with scan.
func collect[T any](rows *sql.Rows, err error, scan func(*sql.Rows) (T, error)) ([]T, error) {
	return sqldb.Collect(rows, err, scan)
}

// exec runs one statement outside a transaction; on SQLite it queues
// with the write transactions.
func (db *DB) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return db.base.Exec(ctx, query, args...)
}

func scanString(r *sql.Rows) (string, error) {
	var s string
	return s, r.Scan(&s)
}
