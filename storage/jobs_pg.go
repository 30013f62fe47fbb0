package storage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
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

// completeBuildPG closes the assignment, ends the job and records the
// build's success in one autocommitted statement, and returns the
// dependents that may now be ready and whether any other build of the
// evaluation is still to run. Only an open assignment of an assigned
// build job changes anything.
const completeBuildPG = `WITH ` + lazyCommitCTE + `,
	a AS (UPDATE job_assignments SET closed_at = $2, outcome = 'completed'
	      WHERE id = $1 AND closed_at IS NULL AND EXISTS (SELECT 1 FROM cfg)
	        AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = job_assignments.job_id AND jobs.kind = 'build' AND jobs.status = 'assigned')
	      RETURNING job_id),
	j AS (UPDATE jobs SET status = 'done' FROM a WHERE jobs.id = a.job_id
	      RETURNING jobs.evaluation_id, jobs.project_id, jobs.build_id),
	b AS (UPDATE builds SET status = 'succeeded', output_info = $3, finished_at = $2,
	      failure_kind = NULL, error = NULL FROM j WHERE builds.id = j.build_id
	      RETURNING builds.id, builds.evaluation_id, builds.drv_path),
	d AS (SELECT w.id FROM b JOIN build_edges e ON e.evaluation_id = b.evaluation_id AND e.dependency_drv_path = b.drv_path
	      JOIN builds w ON w.evaluation_id = e.evaluation_id AND w.drv_path = e.drv_path
	      WHERE w.status = 'waiting')
	SELECT (SELECT count(*) FROM a), (SELECT evaluation_id FROM j), (SELECT project_id FROM j),
	       (SELECT string_agg(id, ',') FROM d),
	       (SELECT count(*) FROM (SELECT 1 FROM builds o JOIN b ON o.evaluation_id = b.evaluation_id
	               WHERE o.id <> b.id AND o.status IN ('waiting', 'queued', 'building') LIMIT $4) x)`

// readyDependentsPG queues those of the dependents (by ID) whose
// dependencies are now all built, with a pending job each, in one
// statement. Two completions readying one dependent both run it after
// their own commits: the later sees both inputs built, and the row's
// status check lets only one of them queue it. (Named by primary key:
// selected by evaluation and status instead, the planner, with the
// statistics of freshly inserted builds, scans every waiting build.)
const readyDependentsPG = `WITH ` + lazyCommitCTE + `, r AS (
	UPDATE builds SET status = 'queued' WHERE id = ANY($2::text[]) AND evaluation_id = $1 AND status = 'waiting'
	  AND EXISTS (SELECT 1 FROM cfg) AND ` + readyNow + ` AND ` + readyCondition + ` RETURNING id)
	INSERT INTO jobs (id, kind, evaluation_id, build_id, project_id, status, ready_at, attempts, created_at)
	SELECT gen_random_uuid()::text, 'build', $1, r.id, $3, 'pending', $4, 0, $4 FROM r
	RETURNING id`

// completeBuildPG is CompleteBuild in one round trip in the common case
// (two when it readies dependents or may end the evaluation), without a
// transaction around the steps: each statement is atomic, and each later
// step re-checks what it depends on. A crash between the steps leaves
// work that RecoverInterruptedWork finishes (ReadyStrandedBuilds,
// FinishDoneEvaluations).
func (db *DB) completeBuildPG(ctx context.Context, assignmentID, info string) ([]string, error) {
	var (
		closed           int
		evalID, project  sql.NullString
		dependents       sql.NullString // comma-separated build IDs
		othersStillToRun int            // capped at finishCheckBound
		err              error
	)
	now := nowMillis()
	for range 5 {
		err = db.hotRow(ctx, completeBuildPG, assignmentID, now, info, finishCheckBound).
			Scan(&closed, &evalID, &project, &dependents, &othersStillToRun)
		if !retryableTxError(err) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if closed == 0 {
		return nil, db.explainNotCompletable(ctx, assignmentID)
	}
	var ready []string
	if dependents.Valid && dependents.String != "" {
		rows, err := db.sql.QueryContext(ctx, readyDependentsPG, evalID.String, strings.Split(dependents.String, ","), project.String, now)
		if ready, err = collect(rows, err, scanString); err != nil {
			return nil, fmt.Errorf("build recorded; readying its dependents failed (ReadyStrandedBuilds retries): %w", err)
		}
	}
	if len(ready) > 0 || othersStillToRun >= finishCheckBound {
		return ready, nil
	}
	// Without a lock: of two last builds completing at once, the later
	// commit sees both done (and the status check ends it only once).
	// Builds still to run that a completion's snapshot shows can only be
	// completions running at the same time, at most one per connection,
	// so the last one always sees fewer than finishCheckBound and checks.
	if _, err := db.sql.ExecContext(ctx, finishEvaluationSQL, evalID.String, nowMillis()); err != nil {
		return ready, fmt.Errorf("build recorded; ending its evaluation failed (the next pass retries): %w", err)
	}
	return ready, nil
}

// finishCheckBound: a completion that sees this many other builds of its
// evaluation still to run cannot be the last one (see completeBuildPG).
const finishCheckBound = postgresMaxConns + 1

// explainNotCompletable names why an assignment could not complete a
// build: closed, unknown, of a flake job, or its job not assigned.
func (db *DB) explainNotCompletable(ctx context.Context, assignmentID string) error {
	var jobID string
	var closedAt sql.NullInt64
	err := db.sql.QueryRowContext(ctx, `SELECT job_id, closed_at FROM job_assignments WHERE id = $1`, assignmentID).Scan(&jobID, &closedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return notFound("assignment %s", assignmentID)
	}
	if err != nil {
		return err
	}
	if closedAt.Valid {
		return conflict("assignment %s is closed", assignmentID)
	}
	var kind JobKind
	var status JobStatus
	if err := db.sql.QueryRowContext(ctx, `SELECT kind, status FROM jobs WHERE id = $1`, jobID).Scan(&kind, &status); err != nil {
		return err
	}
	if kind != JobBuild {
		return invalid("assignment %s is of a flake job", assignmentID)
	}
	return conflict("job %s is %s, not assigned", jobID, status)
}
