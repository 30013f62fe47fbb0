package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// InTx runs fn in a transaction, committing when fn returns nil. On
// SQLite it queues with the process's other writers (LockWriter).
func (db *DB) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	defer db.LockWriter()()
	tx, err := db.sql.BeginTx(ctx, nil)
	return RunTx(tx, err, fn)
}

// InTxRetrying is InTx, run again (up to five times in all) when
// PostgreSQL aborted the transaction as a deadlock victim or a
// serialization failure: for transactions that touch several rows which
// others may lock in another order.
func (db *DB) InTxRetrying(ctx context.Context, fn func(tx *sql.Tx) error) error {
	var err error
	for range 5 {
		err = db.InTx(ctx, fn)
		if !RetryableTxError(err) {
			return err
		}
	}
	return err
}

// RetryableTxError reports PostgreSQL's deadlock and serialization failures,
// after which a transaction may run again.
func RetryableTxError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40P01" || pgErr.Code == "40001"
	}
	return false
}

// LockWriter queues for SQLite's one writer and returns the unlock; a
// no-op on PostgreSQL, whose writers run side by side. For a write that
// needs its own connection (InTx and Exec take it themselves). Never
// take it again while holding it: an InTx or Exec inside a SQLite write
// transaction deadlocks the process (docs/LOCKS.md).
func (db *DB) LockWriter() (unlock func()) {
	if db.engine != EngineSQLite {
		return func() {}
	}
	db.writers.Lock()
	return db.writers.Unlock
}

// RunTx runs fn in tx, which BeginTx returned with err, and commits when
// fn returns nil, else rolls back.
func RunTx(tx *sql.Tx, err error, fn func(tx *sql.Tx) error) error {
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

// Exec runs one statement outside a transaction; on SQLite it queues
// with the write transactions (LockWriter).
func (db *DB) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	defer db.LockWriter()()
	return db.sql.ExecContext(ctx, query, args...)
}

// Querier is what *sql.DB and *sql.Tx share, so a read helper can run
// inside or outside a transaction.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Exists reports whether query returns at least one row.
func Exists(ctx context.Context, q Querier, query string, args ...any) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, query, args...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Collect scans every row of rows with scan.
func Collect[T any](rows *sql.Rows, err error, scan func(*sql.Rows) (T, error)) ([]T, error) {
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

// InList appends values to args as query parameters and returns the
// placeholders naming them ("$3, $4, $5"), for an IN (...) list. Callers
// keep a list to InListMax values: both engines cap the parameters of one
// statement.
func InList(args []any, values []string) ([]any, string) {
	var b strings.Builder
	for i, v := range values {
		if i > 0 {
			b.WriteString(", ")
		}
		args = append(args, v)
		b.WriteString("$" + strconv.Itoa(len(args)))
	}
	return args, b.String()
}

// InListMax is the most values an IN list of one query carries.
const InListMax = 500

// AffectedOne turns a statement's result into NotFound(format, args...)
// when it changed no row.
func AffectedOne(res sql.Result, err error, format string, args ...any) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return NotFound(format, args...)
	}
	return nil
}
