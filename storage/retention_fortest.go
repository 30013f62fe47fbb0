package storage

import (
	"context"
	"encoding/json"
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
