package storage

import (
	"context"
	"database/sql"
)

// PostgreSQL versions of the two hottest state changes. Each round trip
// to the server costs about as much as the work of a statement, so they
// fold the generic statement sequence into data-modifying CTEs: ClaimJob
// becomes one statement (its own transaction), CompleteBuild three in the
// common case. The semantics are those of the generic versions, which
// SQLite runs (it has no data-modifying CTEs, and no round trips).

// lazyCommitCTE sets synchronous_commit off for the statement's
// (implicit or explicit) transaction; see lazyCommit.
const lazyCommitCTE = `cfg AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) AS v)`

const claimJobPG = `WITH ` + lazyCommitCTE + `,
	j AS (UPDATE jobs SET status = 'assigned', attempts = attempts + 1
	      WHERE id = $1 AND status = 'pending' AND EXISTS (SELECT 1 FROM cfg)
	      RETURNING kind, build_id, evaluation_id),
	a AS (INSERT INTO job_assignments (id, job_id, worker_id, opened_at)
	      SELECT $2::text, $1::text, $3::text, $4::bigint FROM j),
	b AS (UPDATE builds SET status = 'building', attempts = builds.attempts + 1, worker_id = $3,
	      started_at = $4, finished_at = NULL FROM j WHERE builds.id = j.build_id),
	e AS (UPDATE evaluations SET status = 'fetching', attempts = evaluations.attempts + 1,
	      started_at = COALESCE(evaluations.started_at, $4)
	      FROM j WHERE j.kind = 'flake' AND evaluations.id = j.evaluation_id)
	SELECT count(*) FROM j`

func (db *DB) claimJobPG(ctx context.Context, jobID, workerID, assignmentID string) error {
	var err error
	for range 5 {
		var n int
		err = db.hotRow(ctx, claimJobPG, jobID, assignmentID, workerID, nowMillis()).Scan(&n)
		switch {
		case constraintOf(err) == uniqueViolation:
			return conflict("job %s already has an open assignment", jobID)
		case retryableTxError(err):
			continue
		case err != nil:
			return err
		case n == 0:
			ok, err := exists(ctx, db.sql, `SELECT 1 FROM jobs WHERE id = $1`, jobID)
			if err != nil {
				return err
			}
			if !ok {
				return notFound("job %s", jobID)
			}
			return conflict("job %s is not pending", jobID)
		}
		return nil
	}
	return err
}

// completeBuildPG closes the assignment, ends the job, records the build's
// success and locks its waiting dependents, in one statement.
const completeBuildPG = `WITH ` + lazyCommitCTE + `,
	a AS (UPDATE job_assignments SET closed_at = $2, outcome = 'completed'
	      WHERE id = $1 AND closed_at IS NULL AND EXISTS (SELECT 1 FROM cfg) RETURNING job_id),
	j AS (UPDATE jobs SET status = 'done' FROM a
	      WHERE jobs.id = a.job_id AND jobs.status = 'assigned' AND jobs.kind = 'build'
	      RETURNING jobs.evaluation_id, jobs.project_id, jobs.build_id),
	b AS (UPDATE builds SET status = 'succeeded', output_info = $3, finished_at = $2,
	      failure_kind = NULL, error = NULL FROM j WHERE builds.id = j.build_id
	      RETURNING builds.evaluation_id, builds.drv_path),
	d AS (SELECT w.id FROM builds w JOIN b ON w.evaluation_id = b.evaluation_id
	      WHERE w.status = 'waiting' AND w.drv_path IN (SELECT e.drv_path FROM build_edges e
	            WHERE e.evaluation_id = b.evaluation_id AND e.dependency_drv_path = b.drv_path)
	      ORDER BY w.id FOR UPDATE OF w)
	SELECT (SELECT count(*) FROM a), (SELECT job_id FROM a), (SELECT evaluation_id FROM j),
	       (SELECT project_id FROM j), (SELECT drv_path FROM b), (SELECT count(*) FROM d)`

// readyDependentsPG queues the dependents (locked by completeBuildPG)
// whose dependencies are now all built, with a pending job each.
const readyDependentsPG = `WITH r AS (
	UPDATE builds SET status = 'queued' WHERE evaluation_id = $1 AND status = 'waiting' AND drv_path IN
	  (SELECT drv_path FROM build_edges WHERE evaluation_id = $1 AND dependency_drv_path = $2)
	  AND ` + readyCondition + ` RETURNING id)
	INSERT INTO jobs (id, kind, evaluation_id, build_id, project_id, status, ready_at, attempts, created_at)
	SELECT gen_random_uuid()::text, 'build', $1, r.id, $3, 'pending', $4, 0, $4 FROM r
	RETURNING id`

func (db *DB) completeBuildPG(ctx context.Context, assignmentID, info string) ([]string, error) {
	var ready []string
	err := db.jobTx(ctx, func(tx *sql.Tx) error {
		ready = nil
		var closed, dependents int
		var jobID, evalID, projectID, drv sql.NullString
		now := nowMillis()
		err := db.txRow(ctx, tx, completeBuildPG, assignmentID, now, info).
			Scan(&closed, &jobID, &evalID, &projectID, &drv, &dependents)
		if err != nil {
			return err
		}
		if closed == 0 {
			_, err := db.closeAssignment(ctx, tx, assignmentID, OutcomeCompleted) // names the error
			if err == nil {
				err = conflict("assignment %s is closed", assignmentID)
			}
			return err
		}
		if !evalID.Valid || !drv.Valid {
			var kind JobKind
			var status JobStatus
			if err := tx.QueryRowContext(ctx, `SELECT kind, status FROM jobs WHERE id = $1`, jobID.String).Scan(&kind, &status); err != nil {
				return err
			}
			if kind != JobBuild {
				return invalid("assignment %s is of a flake job", assignmentID)
			}
			return conflict("job %s is %s, not assigned", jobID.String, status)
		}
		if dependents > 0 {
			rows, err := db.txQuery(ctx, tx, readyDependentsPG, evalID.String, drv.String, projectID.String, now)
			if ready, err = collect(rows, err, scanString); err != nil {
				return err
			}
		}
		if len(ready) == 0 {
			return db.finishEvaluationIfDone(ctx, tx, evalID.String)
		}
		return nil
	})
	return ready, err
}
