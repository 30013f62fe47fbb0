package sqldb

import (
	"context"
	"database/sql"
)

// stmtKey names a prepared statement: its pool and its query.
type stmtKey struct {
	pool  *sql.DB
	query string
}

// Prepared returns the statement for query, prepared once on pool (SQL or
// Keyed) and kept until Close: SQLite otherwise parses the SQL on every
// call, which on a hot path costs more than the query itself. Only for
// constant query strings. The preparation runs without the lock: it
// needs a connection of its own, and with a bounded pool every connection
// may belong to a transaction waiting for this very statement.
func (db *DB) Prepared(ctx context.Context, pool *sql.DB, query string) (*sql.Stmt, error) {
	key := stmtKey{pool, query}
	db.stmtMu.Lock()
	st, ok := db.stmts[key]
	db.stmtMu.Unlock()
	if ok {
		return st, nil
	}
	st, err := pool.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	db.stmtMu.Lock()
	defer db.stmtMu.Unlock()
	if first, ok := db.stmts[key]; ok {
		st.Close() // another caller was first
		return first, nil
	}
	if db.stmts == nil {
		db.stmts = map[stmtKey]*sql.Stmt{}
	}
	db.stmts[key] = st
	return st, nil
}

// closeStatements releases the prepared statements.
func (db *DB) closeStatements() {
	db.stmtMu.Lock()
	defer db.stmtMu.Unlock()
	for _, st := range db.stmts {
		st.Close()
	}
	db.stmts = nil
}
