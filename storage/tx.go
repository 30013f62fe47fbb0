package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// inTx runs fn in a transaction, committing when fn returns nil.
func (db *DB) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	if db.engine == EngineSQLite {
		db.writers.Lock()
		defer db.writers.Unlock()
	}
	tx, err := db.sql.BeginTx(ctx, nil)
	return runTx(tx, err, fn)
}

// runTx runs fn in tx, which BeginTx returned with err, and commits when
// fn returns nil, else rolls back.
func runTx(tx *sql.Tx, err error, fn func(tx *sql.Tx) error) error {
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := fn(tx); err != nil {
		if rbErr := tx.Rollback(); rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) {
			return errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// querier is what *sql.DB and *sql.Tx share, so a read helper can run
// inside or outside a transaction.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// exists reports whether query returns at least one row.
func exists(ctx context.Context, q querier, query string, args ...any) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, query, args...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// collect scans every row of rows with scan.
func collect[T any](rows *sql.Rows, err error, scan func(*sql.Rows) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// exec runs one statement outside a transaction; on SQLite it queues
// with the write transactions (see DB.writers).
func (db *DB) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if db.engine == EngineSQLite {
		db.writers.Lock()
		defer db.writers.Unlock()
	}
	return db.sql.ExecContext(ctx, query, args...)
}
