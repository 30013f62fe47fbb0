package storage

import (
	"context"
	"database/sql"

	"gradient.dev/gradient/storage/sqldb"
)

// What package storage/jobqueue, the job queue on this database, needs of
// it beyond the exported methods.

// Base is db's engine layer: its pools, transactions and writer queue.
func (db *DB) Base() *sqldb.DB { return db.base }

// TouchCachePathsTx marks the rows of hashes in the caches of projectID
// served at now, in tx; false when one of them has no row any more (a
// collection deleted it). The job queue's cached-build marking calls it in
// its own transaction (docs/protocol/cache.md §10.1).
func TouchCachePathsTx(ctx context.Context, tx *sql.Tx, projectID string, hashes []string, now int64) (bool, error) {
	return touchCachePaths(ctx, tx, projectID, hashes, now)
}

// CallGCHook runs the test hook pick chooses, when tests set one
// (SetGCHooksForTest).
func (db *DB) CallGCHook(pick func(*GCHooks) func()) { db.gcHook(pick) }
