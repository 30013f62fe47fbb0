package jobqueue

import (
	"context"
	"database/sql"
	"fmt"

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
	engine storage.Engine

	// On PostgreSQL, concurrent claims and completions share statements
	// (see sqldb.Batcher); nil on SQLite, which runs one writer at a time.
	claims      *sqldb.Batcher[claimCall, bool]
	completions *sqldb.Batcher[completeCall, completion]
}

// New returns the job queue on db.
func New(db *storage.DB) *Queue {
	base := db.Base()
	q := &Queue{store: db, base: base, sql: base.SQL(), keyed: base.Keyed(), engine: base.Engine()}
	if q.engine == storage.EnginePostgres {
		// On PostgreSQL, concurrent claims and completions share
		// statements; SQLite runs one writer at a time.
		q.claims, q.completions = q.newClaimBatcher(), q.newCompletionBatcher()
	}
	return q
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
// parameter (a prepared statement: IN lists of hundreds of parameters are
// planned anew on every call); on SQLite once per sqldb.InListMax IDs.
func queryByIDs[T any](ctx context.Context, q *Queue, query string, ids []string, scan func(*sql.Rows) (T, error)) ([]T, error) {
	return queryByIDsOn(ctx, q, q.sql, query, ids, scan)
}

// queryByIDsOn is queryByIDs on a pool of q: q.sql or q.keyed.
func queryByIDsOn[T any](ctx context.Context, q *Queue, pool *sql.DB, query string, ids []string, scan func(*sql.Rows) (T, error)) ([]T, error) {
	if q.engine == storage.EnginePostgres {
		st, err := q.preparedOn(ctx, pool, fmt.Sprintf(query, "= ANY($1::text[])"))
		if err != nil {
			return nil, err
		}
		rows, err := st.QueryContext(ctx, ids)
		return sqldb.Collect(rows, err, scan)
	}
	var out []T
	for len(ids) > 0 {
		n := min(len(ids), sqldb.InListMax)
		args, in := sqldb.InList(nil, ids[:n])
		ids = ids[n:]
		rows, err := q.sql.QueryContext(ctx, fmt.Sprintf(query, "IN ("+in+")"), args...)
		part, err := sqldb.Collect(rows, err, scan)
		if err != nil {
			return nil, err
		}
		out = append(out, part...)
	}
	return out, nil
}

func scanString(r *sql.Rows) (string, error) {
	var s string
	return s, r.Scan(&s)
}
