package storage

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// BuiltDerivations returns those of drvPaths that some evaluation built
// successfully, with their output paths. The server answers
// QueryKnownDerivations with the ones whose outputs a worker can read, so
// an evaluation need not report them again and its builds may depend on
// them at once.
func (db *DB) BuiltDerivations(ctx context.Context, drvPaths []string) (map[string][]string, error) {
	built := map[string][]string{}
	for len(drvPaths) > 0 {
		n := min(len(drvPaths), 500)
		args := make([]any, n)
		marks := make([]string, n)
		for i, p := range drvPaths[:n] {
			args[i], marks[i] = p, fmt.Sprintf("$%d", i+1)
		}
		drvPaths = drvPaths[n:]
		rows, err := db.sql.QueryContext(ctx, `SELECT drv_path, outputs FROM builds
			WHERE status = 'succeeded' AND drv_path IN (`+strings.Join(marks, ", ")+`)`, args...)
		type row struct {
			drv     string
			outputs sql.NullString
		}
		part, err := collect(rows, err, func(r *sql.Rows) (row, error) {
			var x row
			return x, r.Scan(&x.drv, &x.outputs)
		})
		if err != nil {
			return nil, err
		}
		for _, x := range part {
			outputs, err := decodeJSON[[]BuildOutputPath](x.outputs, "build outputs")
			if err != nil {
				return nil, err
			}
			paths := make([]string, 0, len(outputs))
			for _, o := range outputs {
				if o.Path != "" {
					paths = append(paths, o.Path)
				}
			}
			built[x.drv] = paths
		}
	}
	return built, nil
}

// AddEvaluationErrors records errors an evaluation reported while it runs
// (attributes that failed to evaluate, targets that matched nothing). The
// evaluation still builds what it found, then ends failed with them.
func (db *DB) AddEvaluationErrors(ctx context.Context, evalID string, errs []string) error {
	if len(errs) == 0 {
		return nil
	}
	evalID, err := canonicalUUID("evaluation ID", evalID)
	if err != nil {
		return err
	}
	_, err = db.sql.ExecContext(ctx, `UPDATE evaluations
		SET eval_errors = COALESCE(eval_errors || CAST($2 AS TEXT), '') || CAST($3 AS TEXT)
		WHERE id = $1 AND status IN ('queued', 'fetching', 'evaluating')`,
		evalID, "\n", strings.Join(errs, "\n"))
	return err
}
