package storage

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
)

// inList appends values to args as query parameters and returns the
// placeholders naming them ("$3, $4, $5"), for an IN (...) list. Callers
// keep a list to a few hundred values: both engines cap the parameters of
// one statement.
func inList(args []any, values []string) ([]any, string) {
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

// inListMax is the most values an IN list of one query carries.
const inListMax = 500

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
