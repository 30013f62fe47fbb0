package storage

// NAR objects and the rows that reference them, under collection
// (docs/protocol/cache.md §10.1). Two rules keep a narinfo from ever
// outliving its NAR:
//
//   - A NAR object is deleted only by DeleteQueuedObjects, in a write
//     transaction holding the object's lock, and only while no
//     cache_paths row references it.
//   - A row that is the object's first reference is inserted in a write
//     transaction holding the same lock, after ObjectCheck confirmed the
//     object exists.
//
// Whichever takes the lock first wins: an upload that commits first makes
// the deletion skip the object; a deletion that commits first makes the
// upload's check fail, and the upload is retried (its bytes are stored
// again). A row that is not the first reference needs no check: while a
// committed row references the object, no deletion can start.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
)

// ObjectCheck reports whether the NAR store holds an object: nil if it
// does, an error wrapping ErrObjectMissing if not.
type ObjectCheck func(ctx context.Context, key string) error

// ErrObjectMissing is a row insert refused because its NAR object was
// deleted by a collection after the upload stored it; the upload is
// retried.
var ErrObjectMissing = errors.New("storage: NAR object was collected; upload again")

// SetObjectCheck makes every insert of an object's first reference
// confirm the object exists (the server sets its NAR store's Stat). Set
// it before the DB is shared.
func (db *DB) SetObjectCheck(check ObjectCheck) { db.objectCheck = check }

// objectLockClass is the first half of the PostgreSQL advisory lock of an
// object key (the two-int form, apart from the migrations' one-int form).
const objectLockClass = 0x6e6172 // "nar"

// lockObject takes the object's lock until tx ends: on PostgreSQL a
// transaction-scoped advisory lock; on SQLite the writer lock every write
// transaction holds already.
func (db *DB) lockObject(ctx context.Context, q querier, key string) error {
	if db.engine != EnginePostgres {
		return nil
	}
	_, err := q.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, objectLockClass, objectLockID(key))
	return err
}

// lockObjects takes the locks of keys, in their order, in one statement
// (unnest yields the array in order).
func (db *DB) lockObjects(ctx context.Context, tx *sql.Tx, keys []string) error {
	if db.engine != EnginePostgres || len(keys) == 0 {
		return nil
	}
	ids := make([]int32, len(keys))
	for i, k := range keys {
		ids[i] = objectLockID(k)
	}
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1, k) FROM unnest($2::int4[]) AS t(k)`, objectLockClass, ids)
	return err
}

func objectLockID(key string) int32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int32(h.Sum32())
}

// checkFirstReference runs with the object's lock held, before a row
// referencing key is inserted: if no row references it yet, the object
// must exist.
func (db *DB) checkFirstReference(ctx context.Context, q querier, key string) error {
	if db.objectCheck == nil {
		return nil
	}
	referenced, err := exists(ctx, q, `SELECT 1 FROM cache_paths WHERE object_key = $1 LIMIT 1`, key)
	if err != nil || referenced {
		return err
	}
	if err := db.objectCheck(ctx, key); err != nil {
		return fmt.Errorf("object %s: %w", key, err)
	}
	return nil
}

// queueObjectIfUnused records key in nar_deletions when no row
// references it any more; in the transaction that deleted a row.
func queueObjectIfUnused(ctx context.Context, tx *sql.Tx, key string, size int64) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO nar_deletions (object_key, file_size, queued_at)
		SELECT $1, $2, $3 WHERE NOT EXISTS (SELECT 1 FROM cache_paths WHERE object_key = $1)
		ON CONFLICT (object_key) DO NOTHING`, key, size, nowMillis())
	return err
}

// ObjectDeleter deletes one NAR object; a missing one is no error.
type ObjectDeleter func(ctx context.Context, key string) error

// QueuedObject is an object DeleteQueuedObjects deleted.
type QueuedObject struct {
	Key      string
	FileSize int64
}

// DeleteQueuedObjects deletes up to limit queued objects (all of keys when
// keys is not empty) through del, each under its lock and only while no
// row references it, and returns those deleted; a queued object that is
// referenced again is only dropped from the queue. A crash leaves the
// queue rows of objects not yet committed, and the next call finishes.
func (db *DB) DeleteQueuedObjects(ctx context.Context, keys []string, limit int, del ObjectDeleter) ([]QueuedObject, error) {
	var deleted []QueuedObject
	err := db.inTx(ctx, func(tx *sql.Tx) error {
		deleted = deleted[:0]
		var queued []QueuedObject
		var err error
		if len(keys) > 0 {
			args, in := inList(nil, keys)
			rows, qerr := tx.QueryContext(ctx, `SELECT object_key, file_size FROM nar_deletions
				WHERE object_key IN (`+in+`) ORDER BY object_key`, args...)
			queued, err = collect(rows, qerr, scanQueuedObject)
		} else {
			rows, qerr := tx.QueryContext(ctx, `SELECT object_key, file_size FROM nar_deletions
				ORDER BY object_key LIMIT $1`, limit)
			queued, err = collect(rows, qerr, scanQueuedObject)
		}
		if err != nil {
			return err
		}
		// Sorted: concurrent holders of several object locks take them
		// in one order.
		slices.SortFunc(queued, func(a, b QueuedObject) int { return strings.Compare(a.Key, b.Key) })
		keys := make([]string, len(queued))
		for i, q := range queued {
			keys[i] = q.Key
		}
		if err := db.lockObjects(ctx, tx, keys); err != nil {
			return err
		}
		// With every lock held: which are referenced again, one
		// statement per inListMax objects rather than one an object.
		referenced := map[string]bool{}
		for part := range slices.Chunk(queued, inListMax) {
			keys := make([]string, len(part))
			for i, q := range part {
				keys[i] = q.Key
			}
			args, in := inList(nil, keys)
			rows, err := tx.QueryContext(ctx, `SELECT DISTINCT object_key FROM cache_paths WHERE object_key IN (`+in+`)`, args...)
			used, err := collect(rows, err, scanString)
			if err != nil {
				return err
			}
			for _, k := range used {
				referenced[k] = true
			}
		}
		for _, q := range queued {
			if referenced[q.Key] {
				continue
			}
			if err := del(ctx, q.Key); err != nil {
				return fmt.Errorf("delete object %s: %w", q.Key, err)
			}
			deleted = append(deleted, q)
		}
		for part := range slices.Chunk(queued, inListMax) {
			keys := make([]string, len(part))
			for i, q := range part {
				keys[i] = q.Key
			}
			args, in := inList(nil, keys)
			if _, err := tx.ExecContext(ctx, `DELETE FROM nar_deletions WHERE object_key IN (`+in+`)`, args...); err != nil {
				return err
			}
		}
		return nil
	})
	return deleted, err
}

func scanQueuedObject(r *sql.Rows) (QueuedObject, error) {
	var q QueuedObject
	return q, r.Scan(&q.Key, &q.FileSize)
}

// QueuedObjects returns how many objects wait for deletion and their bytes.
func (db *DB) QueuedObjects(ctx context.Context) (n, bytes int64, err error) {
	err = db.sql.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(file_size), 0) FROM nar_deletions`).Scan(&n, &bytes)
	return n, bytes, err
}
