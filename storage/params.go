package storage

import (
	"context"
	"database/sql"
	"fmt"

	"gradient.dev/gradient/storage/sqldb"
)

// inList is sqldb.InList.
func inList(args []any, values []string) ([]any, string) { return sqldb.InList(args, values) }

// inListMax is the most values an IN list of one query carries.
const inListMax = sqldb.InListMax

// queryByIDs runs query, whose %[1]s stands for the condition "is one of
// ids", and scans its rows: on PostgreSQL once, with the IDs as one array
// parameter (a prepared statement: IN lists of hundreds of parameters are
// planned anew on every call); on SQLite once per inListMax IDs.
func queryByIDs[T any](ctx context.Context, db *DB, query string, ids []string, scan func(*sql.Rows) (T, error)) ([]T, error) {
	return queryByIDsOn(ctx, db, db.sql, query, ids, scan)
}

// queryByIDsOn is queryByIDs on a pool of db: db.sql or db.keyed.
func queryByIDsOn[T any](ctx context.Context, db *DB, pool *sql.DB, query string, ids []string, scan func(*sql.Rows) (T, error)) ([]T, error) {
	if db.engine == EnginePostgres {
		st, err := db.preparedOn(ctx, pool, fmt.Sprintf(query, "= ANY($1::text[])"))
		if err != nil {
			return nil, err
		}
		rows, err := st.QueryContext(ctx, ids)
		return collect(rows, err, scan)
	}
	var out []T
	for len(ids) > 0 {
		n := min(len(ids), inListMax)
		args, in := inList(nil, ids[:n])
		ids = ids[n:]
		rows, err := db.sql.QueryContext(ctx, fmt.Sprintf(query, "IN ("+in+")"), args...)
		part, err := collect(rows, err, scan)
		if err != nil {
			return nil, err
		}
		out = append(out, part...)
	}
	return out, nil
}
