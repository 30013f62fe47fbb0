package jobqueue

import (
	"context"
	"database/sql"
)

// jobTx runs fn in a transaction, retrying it when PostgreSQL aborted it
// as a deadlock victim or a serialization failure: queue transactions
// touch several rows of an evaluation and may meet in any order.
func (q *Queue) jobTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return q.base.InTxRetrying(ctx, fn)
}

// stmt returns the statement for query prepared once on db (see
// prepared), bound to tx. database/sql keeps the per-connection
// preparations, so a hot query is parsed once per connection instead of
// once per call (SQLite parses every unprepared statement anew). Only for
// constant query strings.
func (q *Queue) stmt(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	st, err := q.prepared(ctx, query)
	if err != nil {
		return nil, err
	}
	return tx.StmtContext(ctx, st), nil
}

func (q *Queue) txExec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	st, err := q.stmt(ctx, tx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (q *Queue) txQuery(ctx context.Context, tx *sql.Tx, query string, args ...any) (*sql.Rows, error) {
	st, err := q.stmt(ctx, tx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// txRow is a row scanner carrying a preparation error.
type txRow struct {
	row *sql.Row
	err error
}

func (r txRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.row.Scan(dest...)
}

func (q *Queue) txRow(ctx context.Context, tx *sql.Tx, query string, args ...any) txRow {
	st, err := q.stmt(ctx, tx, query)
	if err != nil {
		return txRow{err: err}
	}
	return txRow{row: st.QueryRowContext(ctx, args...)}
}

// durableJobTx is jobTx for the writes that create or drop queued work
// (an evaluation and its flake job, a cancel): committed, they survive a
// power loss (engine.durableTx).
func (q *Queue) durableJobTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return q.engine.durableTx(ctx, fn)
}
