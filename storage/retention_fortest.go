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
