package storage

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// AddBuildForTest records a build of an evaluation with its outputs and
// status, for other packages' tests of retention (the job path records
// builds through discovery and completion).
func (db *DB) AddBuildForTest(ctx context.Context, evalID, drvPath string, outputs []string, status string) error {
	outs := make([]BuildOutputPath, len(outputs))
	for i, o := range outputs {
		outs[i] = BuildOutputPath{Name: "out", Path: o}
	}
	text, err := json.Marshal(outs)
	if err != nil {
		return err
	}
	_, err = db.exec(ctx, `INSERT INTO builds (id, evaluation_id, drv_path, architecture, required_features,
		outputs, status, created_at) VALUES ($1, $2, $3, 'x86_64-linux', '[]', $4, $5, $6)`,
		NewID(), evalID, drvPath, string(text), status, nowMillis())
	return err
}

// FinishEvaluationForTest ends an evaluation with status, for tests.
func (db *DB) FinishEvaluationForTest(ctx context.Context, evalID string, status EvaluationStatus) error {
	_, err := db.exec(ctx, `UPDATE evaluations SET status = $2, finished_at = $3 WHERE id = $1`, evalID, string(status), nowMillis())
	return err
}

// GCHooks are test hooks that force interleavings of a collection's row
// deletion with the writers that rely on rows (docs/protocol/cache.md
// §10.1). Each is called, when set, at the named point.
type GCHooks struct {
	// DeleteBatchStart runs before a batch's transaction begins.
	DeleteBatchStart func()
	// DeleteBatchDeleted runs inside the batch's transaction after its
	// rows were deleted, before it commits.
	DeleteBatchDeleted func()
	// CachedTouched runs inside MarkBuildsCached's transaction after it
	// touched the rows it relies on, before it commits.
	CachedTouched func()
	// ReuseTouched runs inside ReuseCachePaths' transaction after it set
	// the rows' reused_at, before it commits.
	ReuseTouched func()
}

// SetGCHooksForTest installs hooks (nil: none). Set it before the DB is
// shared.
func (db *DB) SetGCHooksForTest(h *GCHooks) { db.gcHooks = h }

func (db *DB) gcHook(pick func(*GCHooks) func()) {
	if db.gcHooks == nil {
		return
	}
	if fn := pick(db.gcHooks); fn != nil {
		fn()
	}
}

// SyntheticPath is the store path BulkLoadCachePathsForTest gives row i.
func SyntheticPath(i int) string {
	h := fmt.Sprintf("%032d", i)
	h = strings.NewReplacer("0", "a", "1", "b", "2", "c", "3", "d", "4", "f", "5", "g", "6", "h", "7", "i", "8", "j", "9", "k").Replace(h)
	return StoreDir + "/" + h + "-p" + fmt.Sprint(i)
}

// BulkLoadCachePathsForTest inserts n synthetic rows into the cache for
// benchmarks, many rows per statement: row i (SyntheticPath(i)) has its
// own object, references row i-1 unless i is a multiple of chain, and is
// pushed (a collection root) when pushed(i). created_at is an hour ago.
func (db *DB) BulkLoadCachePathsForTest(ctx context.Context, cacheID string, n, chain int, pushed func(int) bool) error {
	const perStatement = 500 // 14 parameters a row: within both engines' limits
	created := time.Now().Add(-time.Hour).UnixMilli()
	for start := 0; start < n; start += 50 * perStatement {
		err := db.inTx(ctx, func(tx *sql.Tx) error {
			for s := start; s < min(n, start+50*perStatement); s += perStatement {
				var b strings.Builder
				b.WriteString(`INSERT INTO cache_paths (cache_id, store_hash, store_path, nar_hash, nar_size, file_hash, file_size,
					compression, refs, deriver, ca, object_key, created_at, pushed, expires_at) VALUES `)
				var args []any
				for i := s; i < min(n, s+perStatement); i++ {
					if i > s {
						b.WriteString(", ")
					}
					p := SyntheticPath(i)
					refs := ""
					if i%chain != 0 {
						refs = strings.TrimPrefix(SyntheticPath(i-1), StoreDir+"/")
					}
					key := fmt.Sprintf("%052d", i)
					k := len(args)
					fmt.Fprintf(&b, "($%d, $%d, $%d, $%d, $%d, $%d, $%d, $%d, $%d, $%d, $%d, $%d, $%d, $%d, NULL)",
						k+1, k+2, k+3, k+4, k+5, k+6, k+7, k+8, k+9, k+10, k+11, k+12, k+13, k+14)
					args = append(args, cacheID, p[len(StoreDir)+1:len(StoreDir)+33], p, "sha256:"+key, int64(1000), "sha256:"+key,
						int64(500), "zstd", refs, "", "", key, created, pushed(i))
				}
				if _, err := tx.ExecContext(ctx, b.String(), args...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// AgeCachePathsForTest moves every row's upload, reuse and serve times d
// into the past, so tests of the grace period need not wait for it.
func (db *DB) AgeCachePathsForTest(ctx context.Context, d time.Duration) error {
	_, err := db.exec(ctx, `UPDATE cache_paths SET created_at = created_at - $1,
		reused_at = reused_at - $1, last_served = last_served - $1`, d.Milliseconds())
	return err
}
