package jobqueue

import (
	"context"
	"database/sql"
	"slices"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// Import from derivation (docs/protocol/jobs.md §14): while an evaluation runs, the
// worker may need derivations built before it can go on. It reports them
// (with their closures) like any derivation, then asks for them; the
// builds it asks for and every build of the evaluation they depend on are
// marked for_import, and those are queued as soon as their inputs are
// built, ahead of the evaluation's end.

// RequestImports marks the builds of drvPaths in the evaluation, and the
// builds they depend on, as needed now, and queues those whose inputs are
// built. It returns the jobs it made pending and the drvPaths the
// evaluation has no build for.
func (q *Queue) RequestImports(ctx context.Context, evalID string, drvPaths []string) (ready, unknown []string, err error) {
	evalID, err = sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, nil, err
	}
	if len(drvPaths) == 0 {
		return nil, nil, nil
	}
	args, in := sqldb.InList([]any{evalID}, drvPaths)
	err = q.jobTx(ctx, func(tx *sql.Tx) error {
		ready, unknown = nil, nil
		var project string
		if err := tx.QueryRowContext(ctx, `SELECT project_id FROM evaluations WHERE id = $1`, evalID).Scan(&project); err != nil {
			if err == sql.ErrNoRows {
				return sqldb.NotFound("evaluation %s", evalID)
			}
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT drv_path FROM builds WHERE evaluation_id = $1 AND drv_path IN (`+in+`)`, args...)
		known, err := sqldb.Collect(rows, err, scanString)
		if err != nil {
			return err
		}
		for _, p := range drvPaths {
			if !slices.Contains(known, p) {
				unknown = append(unknown, p)
			}
		}
		if _, err := tx.ExecContext(ctx, `WITH RECURSIVE c(drv) AS (
				SELECT drv_path FROM builds WHERE evaluation_id = $1 AND drv_path IN (`+in+`)
				UNION SELECT e.dependency_drv_path FROM build_edges e JOIN c ON e.drv_path = c.drv WHERE e.evaluation_id = $1)
			UPDATE builds SET for_import = TRUE WHERE evaluation_id = $1 AND drv_path IN (SELECT drv FROM c)`, args...); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, `UPDATE builds SET status = 'queued'
			WHERE evaluation_id = $1 AND status = 'waiting' AND for_import AND `+readyCondition+` RETURNING id`, evalID)
		builds, err := sqldb.Collect(rows, err, scanString)
		if err != nil {
			return err
		}
		ready, err = q.insertBuildJobs(ctx, tx, jobRef{kind: storage.JobBuild, evalID: evalID, projectID: project}, builds)
		return err
	})
	return ready, unknown, err
}

// ImportBuilds returns the builds of drvPaths in the evaluation, by drv
// path (absent: no such build).
func (q *Queue) ImportBuilds(ctx context.Context, evalID string, drvPaths []string) (map[string]storage.Build, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	out := map[string]storage.Build{}
	if len(drvPaths) == 0 {
		return out, nil
	}
	args, in := sqldb.InList([]any{evalID}, drvPaths)
	rows, err := q.sql.QueryContext(ctx, `SELECT `+buildColumns+` FROM builds
		WHERE evaluation_id = $1 AND drv_path IN (`+in+`)`, args...)
	builds, err := sqldb.Collect(rows, err, func(r *sql.Rows) (storage.Build, error) { return scanBuild(r) })
	for _, b := range builds {
		out[b.DrvPath] = b
	}
	return out, err
}
