package jobqueue

import (
	"context"
	"database/sql"
	"errors"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// Builds stream while their evaluation evaluates (docs/protocol/jobs.md
// §9.1): each EvalResult batch's builds whose inputs are all known built
// are queued at once instead of at the evaluation's end.
//
// While the evaluation runs, an input without a build in it is either one
// the worker will report later or one the server told it is built
// (QueryKnownDerivations): only a succeeded build of that derivation,
// here or in another evaluation, tells them apart. So the condition is
// stricter than readyCondition's: every input has a succeeded build. The
// evaluation's end still queues the rest (CompleteFlakeJobChunk).

// streamCondition: every dependency of the build (the UPDATE's row) has
// a succeeded build, in its evaluation or another.
const streamCondition = `NOT EXISTS (SELECT 1 FROM build_edges se
	WHERE se.evaluation_id = builds.evaluation_id AND se.drv_path = builds.drv_path
	AND NOT EXISTS (SELECT 1 FROM builds sd WHERE sd.drv_path = se.dependency_drv_path AND sd.status = 'succeeded'))`

// QueueStreamedBuilds queues those of the builds of drvPaths in an
// evaluation still evaluating whose inputs are all built (streamCondition
// and readyCondition), and returns their pending jobs. Nothing for an
// evaluation that is not evaluating.
func (q *Queue) QueueStreamedBuilds(ctx context.Context, evalID string, drvPaths []string) ([]string, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	if len(drvPaths) == 0 {
		return nil, nil
	}
	var ready []string
	err = q.jobTx(ctx, func(tx *sql.Tx) error {
		ready = nil
		var project string
		err := q.txRow(ctx, tx, `SELECT project_id FROM evaluations WHERE id = $1 AND status IN ('fetching', 'evaluating')`, evalID).Scan(&project)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // ended, failed or cancelled meanwhile
		}
		if err != nil {
			return err
		}
		var builds []string
		for rest := drvPaths; len(rest) > 0; {
			n := min(len(rest), sqldb.InListMax)
			args, in := sqldb.InList([]any{evalID}, rest[:n])
			rest = rest[n:]
			rows, err := q.txQuery(ctx, tx, `UPDATE builds SET status = 'queued'
				WHERE evaluation_id = $1 AND status = 'waiting' AND drv_path IN (`+in+`)
				AND `+readyCondition+` AND `+streamCondition+` RETURNING id`, args...)
			part, err := sqldb.Collect(rows, err, scanString)
			if err != nil {
				return err
			}
			builds = append(builds, part...)
		}
		ready, err = q.insertBuildJobs(ctx, tx, jobRef{kind: storage.JobBuild, evalID: evalID, projectID: project}, builds)
		return err
	})
	return ready, err
}

// StopEvaluationBuilds ends the build jobs of an evaluation whose
// evaluation failed: builds streamed while it evaluated must not go on
// (the failure already cancelled the waiting and queued builds). It
// closes their open assignments, as cancelled, and returns them for the
// workers to be told, and how many build jobs it ended.
func (q *Queue) StopEvaluationBuilds(ctx context.Context, evalID string) (open []storage.OpenAssignment, stopped int, err error) {
	evalID, err = sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, 0, err
	}
	err = q.jobTx(ctx, func(tx *sql.Tx) error {
		open, stopped = nil, 0
		now := sqldb.NowMillis()
		rows, err := tx.QueryContext(ctx,
			`UPDATE job_assignments SET closed_at = $2, outcome = $3
			 WHERE closed_at IS NULL AND job_id IN (SELECT id FROM jobs WHERE evaluation_id = $1 AND kind = 'build' AND status IN ('pending', 'assigned'))
			 RETURNING `+openAssignmentColumns, evalID, now, OutcomeCancelled)
		open, err = sqldb.Collect(rows, err, scanOpenAssignment)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'cancelled'
			WHERE evaluation_id = $1 AND kind = 'build' AND status IN ('pending', 'assigned')`, evalID)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		stopped = int(n)
		_, err = tx.ExecContext(ctx, `UPDATE builds SET status = 'cancelled', error = 'evaluation failed', finished_at = $2
			WHERE evaluation_id = $1 AND status IN ('waiting', 'queued', 'building')`, evalID, now)
		return err
	})
	return open, stopped, err
}
