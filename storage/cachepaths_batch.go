package storage

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"

	"gradient.dev/gradient/storage/sqldb"
)

// An evaluation uploads every .drv as its own object, and each commit
// writes one narinfo row. Rows of commits arriving together go in one
// transaction (sqldb.Batcher): on SQLite each transaction of its own rewrote
// the table's and indexes' pages into the WAL, and on PostgreSQL it is a
// WAL flush each. PutCachePath still returns only after its row's
// transaction committed, so an acknowledged upload's row is as durable
// as before; when a batch fails, each row is tried alone, so an error
// (a deleted cache) reaches only its own upload.

// cachePathBatchMax bounds the rows of one transaction.
const cachePathBatchMax = 64

// cachePathPut is one checked row for PutCachePath and its outcome.
type cachePathPut struct {
	row     CachePath
	hash    string // the store path's hash part
	created bool
}

const insertCachePathSQL = `INSERT INTO cache_paths (cache_id, store_hash, store_path, nar_hash, nar_size, file_hash,
	file_size, compression, refs, deriver, ca, object_key, created_at, pushed, expires_at)
 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
 ON CONFLICT (cache_id, store_hash) DO NOTHING`

const selectCachePathSQL = `SELECT ` + cachePathColumns + ` FROM cache_paths WHERE cache_id = $1 AND store_hash = $2`

func (db *DB) newCachePathBatcher() *sqldb.Batcher[cachePathPut, cachePathPut] {
	return &sqldb.Batcher[cachePathPut, cachePathPut]{Max: cachePathBatchMax, Run: db.putCachePaths}
}

// putCachePaths inserts the rows in one transaction, in order, and
// returns for each the row now stored (its own, or the one recorded
// before it) and whether it was created.
func (db *DB) putCachePaths(ctx context.Context, puts []cachePathPut) ([]cachePathPut, error) {
	// Prepared before the transaction: preparing needs a connection of
	// its own (see prepared).
	insert, err := db.prepared(ctx, insertCachePathSQL)
	if err != nil {
		return nil, err
	}
	if len(puts) == 1 && db.engine == EngineSQLite {
		// Alone: the insert commits by itself, which spares a BEGIN and
		// a COMMIT statement; the lookup of a row stored before needs
		// no transaction either (rows are never changed, only deleted).
		// The writer lock is the object's lock (retention_objects.go).
		unlock := db.base.LockWriter() // queues like a transaction
		done, err := db.putCachePath(ctx, insert, db.sql, puts[0])
		unlock()
		if err != nil {
			return nil, err
		}
		return []cachePathPut{done}, nil
	}
	// In the objects' key order: concurrent batches, and the deletion of
	// objects, take the objects' locks in one order.
	order := make([]int, len(puts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(puts[a].row.ObjectKey, puts[b].row.ObjectKey) })
	out := make([]cachePathPut, len(puts))
	err = db.inTx(ctx, func(tx *sql.Tx) error {
		ins := tx.StmtContext(ctx, insert)
		defer ins.Close()
		for _, i := range order {
			if err := db.lockObject(ctx, tx, puts[i].row.ObjectKey); err != nil {
				return err
			}
			done, err := db.putCachePath(ctx, ins, tx, puts[i])
			if err != nil {
				return err
			}
			out[i] = done
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// putCachePath inserts one row with insert (in a transaction, or on its
// own under the writer lock), reading the row stored before through q
// when there was one.
func (db *DB) putCachePath(ctx context.Context, insert *sql.Stmt, q querier, put cachePathPut) (cachePathPut, error) {
	p := put.row
	if err := db.checkFirstReference(ctx, q, p.ObjectKey); err != nil {
		return cachePathPut{}, err
	}
	var expires any
	if !p.ExpiresAt.IsZero() {
		expires = p.ExpiresAt.UnixMilli()
	}
	args := []any{p.CacheID, put.hash, p.StorePath, p.NarHash, p.NarSize, p.FileHash, p.FileSize,
		p.Compression, strings.Join(p.References, " "), p.Deriver, p.CA, p.ObjectKey, p.CreatedAt.UnixMilli(), p.Pushed, expires}
	res, err := insert.ExecContext(ctx, args...)
	if constraintOf(err) == foreignKeyViolation {
		return cachePathPut{}, notFound("cache %s", p.CacheID)
	}
	if err != nil {
		return cachePathPut{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return cachePathPut{}, err
	}
	if n == 1 {
		return cachePathPut{row: p, hash: put.hash, created: true}, nil
	}
	// Recorded already (the first upload wins): return that row.
	stored, err := scanCachePath(q.QueryRowContext(ctx, selectCachePathSQL, p.CacheID, put.hash))
	if errors.Is(err, sql.ErrNoRows) {
		err = notFound("path %s in cache %s", put.hash, p.CacheID)
	}
	if err != nil {
		return cachePathPut{}, err
	}
	return cachePathPut{row: stored, hash: put.hash}, nil
}
