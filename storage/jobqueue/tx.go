package jobqueue

import (
	"context"
	"database/sql"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
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
// power loss. PostgreSQL commits so by default. SQLite connections run
// with synchronous=NORMAL, which in WAL mode survives a crash of the
// process but may lose the last commits to one of the machine; the
// transaction runs on a connection switched to FULL for it.
func (q *Queue) durableJobTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	if q.engine != storage.EngineSQLite {
		return q.jobTx(ctx, fn)
	}
	defer q.base.LockWriter()()
	conn, err := q.sql.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `PRAGMA synchronous = FULL`); err != nil {
		return err
	}
	defer func() {
		// Back to the pool's setting; should this fail, the connection
		// only stays slower.
		conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA synchronous = NORMAL`)
	}()
	tx, err := conn.BeginTx(ctx, nil)
	return sqldb.RunTx(tx, err, fn)
}

// lazyCommit lets a PostgreSQL transaction commit without waiting for its
// WAL flush (synchronous_commit off, for this transaction only). Used for
// the hot state changes of running work (claim, complete, fail, release):
// a crash may lose the last few of them, but the WAL keeps transactions
// in order, so what survives is a consistent earlier state, and
// RecoverInterruptedWork turns its open assignments back into pending
// jobs. Creating evaluations (the queued work itself) and cancelling them
// stay synchronous (durableJobTx). SQLite runs with synchronous=NORMAL in
// WAL mode, which already trades the same durability for speed.
func (q *Queue) lazyCommit(ctx context.Context, tx *sql.Tx) error {
	if q.engine != storage.EnginePostgres {
		return nil
	}
	_, err := q.txExec(ctx, tx, `SELECT set_config('synchronous_commit', 'off', true)`)
	return err
}

// forUpdate is the row-locking suffix of a SELECT: PostgreSQL needs it to
// serialise concurrent completions in one evaluation; SQLite transactions
// hold the database write lock (BEGIN IMMEDIATE) and have no such clause.
func (q *Queue) forUpdate() string {
	if q.engine == storage.EnginePostgres {
		return ` FOR UPDATE`
	}
	return ``
}
