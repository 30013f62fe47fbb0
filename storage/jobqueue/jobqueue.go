package jobqueue

import (
	"context"
	"database/sql"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// Queue is the job queue on a storage database. It keeps no state of its
// own beyond prepared statements and the batching of concurrent calls, so
// several Queues on one database (the scheduler's, the admin API's) agree.
type Queue struct {
	store  *storage.DB // projects' caches and cache paths, test hooks
	base   *sqldb.DB   // the engine layer: pools, transactions, writer queue
	sql    *sql.DB     // base's pool, for the queries
	keyed  *sql.DB     // base's pool for statements that go by key (claims, completions)
	engine engine      // what differs between SQLite and PostgreSQL
	// instance is the server instance the queue claims for (ForInstance):
	// recorded with every assignment it opens; "" records none (NULL).
	instance string
}

// Option configures New.
type Option func(*Queue)

// ForInstance makes the queue claim jobs for the server instance id
// (server/instance; README "Several instances"): every assignment it opens
// names id, so that recovery after a crash touches only this instance's
// work (RecoverInterruptedWork) and other instances re-queue it only once
// this instance is dead (RecoverDeadInstances). Without it (or with ""),
// assignments name no instance.
func ForInstance(id string) Option { return func(q *Queue) { q.instance = id } }

// New returns the job queue on db.
func New(db *storage.DB, opts ...Option) *Queue {
	base := db.Base()
	q := &Queue{store: db, base: base, sql: base.SQL(), keyed: base.Keyed()}
	for _, o := range opts {
		o(q)
	}
	if base.Engine() == storage.EnginePostgres {
		q.engine = newPostgres(q)
	} else {
		q.engine = sqlite{q}
	}
	return q
}

// ParallelCompletions reports whether build completions from several
// goroutines run side by side, sharing statements (PostgreSQL), rather
// than queueing for the one writer (SQLite). A caller gains by recording
// completions off its own loop only when they do.
func (q *Queue) ParallelCompletions() bool { return q.engine.parallelCompletions() }

// Instance is the server instance the queue claims for ("" for none).
func (q *Queue) Instance() string { return q.instance }

// instanceArg is the instance as a statement's argument: NULL for none.
func (q *Queue) instanceArg() any {
	if q.instance == "" {
		return nil
	}
	return q.instance
}

// prepared returns the statement for query, prepared once on q.sql
// (sqldb.DB.Prepared).
func (q *Queue) prepared(ctx context.Context, query string) (*sql.Stmt, error) {
	return q.base.Prepared(ctx, q.sql, query)
}

// preparedOn is prepared on a pool of q: q.sql or q.keyed.
func (q *Queue) preparedOn(ctx context.Context, pool *sql.DB, query string) (*sql.Stmt, error) {
	return q.base.Prepared(ctx, pool, query)
}

// keyedRow runs a query through a statement prepared once on the keyed
// pool (sqldb.DB.Keyed), for statements whose plans must go by key however
// small their tables were when the plan was made.
func (q *Queue) keyedRow(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := q.preparedOn(ctx, q.keyed, query)
	if err != nil {
		return q.keyed.QueryRowContext(ctx, query, args...) // reports the error
	}
	return st.QueryRowContext(ctx, args...)
}

// exec runs one statement outside a transaction; on SQLite it queues
// with the write transactions.
func (q *Queue) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return q.base.Exec(ctx, query, args...)
}

// queryByIDs runs query, whose %[1]s stands for the condition "is one of
// ids", and scans its rows: on PostgreSQL once, with the IDs as one array
// parameter; on SQLite once per sqldb.InListMax IDs.
func queryByIDs[T any](ctx context.Context, q *Queue, query string, ids []string, scan func(*sql.Rows) (T, error)) ([]T, error) {
	return queryByIDsOn(ctx, q, q.sql, query, ids, scan)
}

// queryByIDsOn is queryByIDs on a pool of q: q.sql or q.keyed.
func queryByIDsOn[T any](ctx context.Context, q *Queue, pool *sql.DB, query string, ids []string, scan func(*sql.Rows) (T, error)) ([]T, error) {
	var out []T
	err := q.engine.queryByIDs(ctx, pool, query, ids, func(rows *sql.Rows, err error) error {
		part, err := sqldb.Collect(rows, err, scan)
		if out == nil {
			out = part // one query, no copy (PostgreSQL's only one)
		} else {
			out = append(out, part...)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func scanString(r *sql.Rows) (string, error) {
	var s string
	return s, r.Scan(&s)
}
