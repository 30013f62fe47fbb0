package jobqueue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// postgres is the queue's engine on PostgreSQL. Writers run side by
// side, so rows are locked where completions of one evaluation meet, and
// the hot state changes commit without waiting for their WAL flush
// (lazyCommit).
//
// The two hottest state changes have versions of their own. Each statement
// costs far more than a row it changes (executor start-up on four tables,
// a round trip), so they fold the generic statement sequence into
// data-modifying CTEs over arrays of calls, and concurrent calls share
// one statement (see sqldb.Batcher): ClaimJob is one statement for a whole
// batch, CompleteBuild one for a batch plus, per call, one when it
// readies dependents or may end the evaluation. A call alone runs a
// cheaper one-call form of the same statement. The semantics are those
// of the generic versions, which SQLite runs (sqlite.go: it has no
// data-modifying CTEs, and one writer).
type postgres struct {
	*Queue
	claims      *sqldb.Batcher[claimCall, bool]
	completions *sqldb.Batcher[completeCall, completion]
}

func newPostgres(q *Queue) *postgres {
	pg := &postgres{Queue: q}
	pg.claims, pg.completions = pg.newClaimBatcher(), pg.newCompletionBatcher()
	return pg
}

// parallelCompletions: completions run side by side and share statements.
func (*postgres) parallelCompletions() bool { return true }

// lazyCommitCTE sets synchronous_commit off for the statement's
// (implicit or explicit) transaction; see lazyCommit.
const lazyCommitCTE = `cfg AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) AS v)`

// pendingJob is "jobs.status = 'pending'" in a form no index serves:
// given plainly, the planner finds a claim's jobs through the partial
// index of pending ones (jobs_pending), walking every pending job (and
// the entries of those claimed since the last vacuum) on every claim,
// instead of by primary key: a claim would cost as much as the queue is
// long.
const pendingJob = `CASE WHEN jobs.status = 'pending' THEN true ELSE false END`

// claimJobSQL is claimJobsSQL for one call, which it serves at about
// two thirds of the cost (the batch form's unnest and DISTINCT ON): most
// claims run alone when the server is not busy. It returns 1 if claimed.
const claimJobSQL = `WITH ` + lazyCommitCTE + `,
	j AS (UPDATE jobs SET status = 'assigned', attempts = attempts + 1
	      WHERE id = $1 AND ` + pendingJob + ` AND EXISTS (SELECT 1 FROM cfg)
	      RETURNING kind, build_id, evaluation_id),
	a AS (INSERT INTO job_assignments (id, job_id, worker_id, opened_at, instance_id)
	      SELECT $2::text, $1::text, $3::text, $4::bigint, $5::text FROM j),
	b AS (UPDATE builds SET status = 'building', attempts = builds.attempts + 1, worker_id = $3,
	      started_at = $4, finished_at = NULL FROM j WHERE builds.id = j.build_id),
	e AS (UPDATE evaluations SET status = ` + claimedEvaluationStatus + `,
	      attempts = evaluations.attempts + 1,
	      started_at = COALESCE(evaluations.started_at, $4)
	      FROM j WHERE j.kind = 'flake' AND evaluations.id = j.evaluation_id)
	SELECT count(*) FROM j`

// claimJobsSQL claims the jobs of many calls: each job's assignment is
// opened, the job assigned, its build building or its evaluation
// fetching; each assignment names the queue's instance ($5, NULL for
// none). Of two calls for one job, the first wins. It returns the
// assignment IDs of the calls that claimed their job.
const claimJobsSQL = `WITH ` + lazyCommitCTE + `,
	r AS (SELECT DISTINCT ON (job_id) job_id, assignment_id, worker_id
	      FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS r(job_id, assignment_id, worker_id, n)
	      ORDER BY job_id, n),
	j AS (UPDATE jobs SET status = 'assigned', attempts = attempts + 1 FROM r
	      WHERE jobs.id = r.job_id AND ` + pendingJob + ` AND EXISTS (SELECT 1 FROM cfg)
	      RETURNING jobs.id, jobs.kind, jobs.build_id, jobs.evaluation_id, r.assignment_id, r.worker_id),
	a AS (INSERT INTO job_assignments (id, job_id, worker_id, opened_at, instance_id)
	      SELECT assignment_id, id, worker_id, $4::bigint, $5::text FROM j),
	b AS (UPDATE builds SET status = 'building', attempts = builds.attempts + 1, worker_id = j.worker_id,
	      started_at = $4, finished_at = NULL FROM j WHERE builds.id = j.build_id),
	e AS (UPDATE evaluations SET status = ` + claimedEvaluationStatus + `,
	      attempts = evaluations.attempts + 1,
	      started_at = COALESCE(evaluations.started_at, $4)
	      FROM j WHERE j.kind = 'flake' AND evaluations.id = j.evaluation_id)
	SELECT assignment_id FROM j`

type claimCall struct{ jobID, workerID, assignmentID string }

// maxBatch bounds the calls one batched statement serves; batchLanes
// statements of a kind run at once (two: while one batch waits for its
// commit, the next can use the other core).
const (
	maxBatch   = 64
	batchLanes = 2
)

func (pg *postgres) newClaimBatcher() *sqldb.Batcher[claimCall, bool] {
	return &sqldb.Batcher[claimCall, bool]{Max: maxBatch, Lanes: batchLanes, Run: pg.claimBatch}
}

// claimBatch runs claimJobsSQL (claimJobSQL for one call) and reports
// for each call whether it claimed its job.
func (pg *postgres) claimBatch(ctx context.Context, calls []claimCall) ([]bool, error) {
	if len(calls) == 1 {
		c := calls[0]
		var n int
		err := retryingStatement(func() error {
			return pg.keyedRow(ctx, claimJobSQL, c.jobID, c.assignmentID, c.workerID, sqldb.NowMillis(), pg.instanceArg()).Scan(&n)
		})
		return []bool{n == 1}, err
	}
	jobs, assignments, workers := make([]string, len(calls)), make([]string, len(calls)), make([]string, len(calls))
	for i, c := range calls {
		jobs[i], assignments[i], workers[i] = c.jobID, c.assignmentID, c.workerID
	}
	st, err := pg.preparedOn(ctx, pg.keyed, claimJobsSQL)
	if err != nil {
		return nil, err
	}
	var claimed []string
	err = retryingStatement(func() error {
		rows, err := st.QueryContext(ctx, jobs, assignments, workers, sqldb.NowMillis(), pg.instanceArg())
		claimed, err = sqldb.Collect(rows, err, scanString)
		return err
	})
	if err != nil {
		return nil, err
	}
	won := make(map[string]bool, len(claimed))
	for _, id := range claimed {
		won[id] = true
	}
	out := make([]bool, len(calls))
	for i, c := range calls {
		out[i] = won[c.assignmentID]
	}
	return out, nil
}

// claim is ClaimJob on PostgreSQL: concurrent claims share one statement.
func (pg *postgres) claim(ctx context.Context, jobID, workerID, assignmentID string) error {
	claimed, err := pg.claims.Do(ctx, claimCall{jobID, workerID, assignmentID})
	switch {
	case sqldb.ConstraintOf(err) == sqldb.UniqueViolation:
		return sqldb.Conflict("job %s already has an open assignment", jobID)
	case err != nil:
		return err
	case !claimed:
		return pg.explainUnclaimed(ctx, jobID)
	}
	return nil
}

// retryingStatement runs an autocommitted statement again when
// PostgreSQL aborted it for a deadlock or a serialization failure.
func retryingStatement(run func() error) error {
	var err error
	for range 5 {
		if err = run(); !sqldb.RetryableTxError(err) {
			return err
		}
	}
	return err
}

// explainUnclaimed names why a claim of a job changed nothing.
func (pg *postgres) explainUnclaimed(ctx context.Context, jobID string) error {
	ok, err := sqldb.Exists(ctx, pg.sql, `SELECT 1 FROM jobs WHERE id = $1`, jobID)
	if err != nil {
		return err
	}
	if !ok {
		return sqldb.NotFound("job %s", jobID)
	}
	return sqldb.Conflict("job %s is not pending", jobID)
}

// openAssignment is "closed_at IS NULL" in a form no index serves: given
// plainly, the planner finds the assignments through the partial index of
// open ones (job_assignments_open), whose entries of assignments closed
// since the last vacuum it walks on every completion, instead of by
// primary key.
const openAssignment = `CASE WHEN job_assignments.closed_at IS NULL THEN true ELSE false END`

// waitingDependent is "w.status = 'waiting'" in a form no index serves,
// so a completion reaches its dependents through its edges and then by
// key; given plainly, the planner scans the evaluation's waiting builds
// once per completed build, which while a large evaluation's builds are
// still being readied are nearly all of them.
const waitingDependent = `CASE WHEN w.status = 'waiting' THEN true ELSE false END`

// completeBuildSQL is completeBuildsSQL for one call, cheaper in the
// same way as claimJobSQL. Its columns: 1 if it completed, the
// evaluation, the project, the waiting dependents, the others to run.
const completeBuildSQL = `WITH ` + lazyCommitCTE + `,
	a AS (UPDATE job_assignments SET closed_at = $2, outcome = 'completed'
	      WHERE id = $1 AND ` + openAssignment + ` AND EXISTS (SELECT 1 FROM cfg)
	        AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = job_assignments.job_id AND jobs.kind = 'build' AND jobs.status = 'assigned')
	      RETURNING job_id),
	j AS (UPDATE jobs SET status = 'done' FROM a WHERE jobs.id = a.job_id
	      RETURNING jobs.evaluation_id, jobs.project_id, jobs.build_id),
	b AS (UPDATE builds SET status = 'succeeded', output_info = $3, finished_at = $2,
	      failure_kind = NULL, error = NULL FROM j WHERE builds.id = j.build_id
	      RETURNING builds.id, builds.evaluation_id, builds.drv_path),
	d AS (SELECT w.id FROM b JOIN build_edges e ON e.evaluation_id = b.evaluation_id AND e.dependency_drv_path = b.drv_path
	      JOIN builds w ON w.evaluation_id = e.evaluation_id AND w.drv_path = e.drv_path
	      WHERE ` + waitingDependent + `)
	SELECT (SELECT count(*) FROM a), (SELECT evaluation_id FROM j), (SELECT project_id FROM j),
	       (SELECT string_agg(id, ',') FROM d),
	       CASE WHEN $5::boolean THEN (SELECT count(*) FROM (SELECT 1 FROM builds o JOIN b ON o.evaluation_id = b.evaluation_id
	               WHERE o.id <> b.id AND o.status IN ('waiting', 'queued', 'building') LIMIT $4) x) ELSE $4 END`

// completeBuildsSQL records the success of many calls' builds: each
// open assignment of an assigned build job is closed, its job done, its
// build succeeded. It returns, per completed build, its waiting
// dependents and how many other builds of its evaluation are still to
// run (leaving out the whole batch, capped at $4; $4 itself unless $5,
// for callers that check the end themselves: CompleteBuildDeferEnd). d
// and o are materialized so they run once per batch, not once per
// completed build.
const completeBuildsSQL = `WITH ` + lazyCommitCTE + `,
	r AS (SELECT * FROM unnest($1::text[], $2::text[]) AS r(assignment_id, info)),
	a AS (UPDATE job_assignments SET closed_at = $3, outcome = 'completed' FROM r
	      WHERE job_assignments.id = r.assignment_id AND ` + openAssignment + ` AND EXISTS (SELECT 1 FROM cfg)
	        AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = job_assignments.job_id AND jobs.kind = 'build' AND jobs.status = 'assigned')
	      RETURNING job_assignments.id AS assignment_id, job_assignments.job_id, r.info),
	j AS (UPDATE jobs SET status = 'done' FROM a WHERE jobs.id = a.job_id
	      RETURNING a.assignment_id, a.info, jobs.evaluation_id, jobs.project_id, jobs.build_id),
	b AS (UPDATE builds SET status = 'succeeded', output_info = j.info, finished_at = $3,
	      failure_kind = NULL, error = NULL FROM j WHERE builds.id = j.build_id
	      RETURNING j.assignment_id, j.project_id, builds.id, builds.evaluation_id, builds.drv_path),
	d AS MATERIALIZED (SELECT b.assignment_id, string_agg(w.id, ',') AS ids FROM b
	      JOIN build_edges e ON e.evaluation_id = b.evaluation_id AND e.dependency_drv_path = b.drv_path
	      JOIN builds w ON w.evaluation_id = e.evaluation_id AND w.drv_path = e.drv_path
	      WHERE ` + waitingDependent + ` GROUP BY b.assignment_id),
	o AS MATERIALIZED (SELECT ev.evaluation_id,
	        (SELECT count(*) FROM (SELECT 1 FROM builds o WHERE o.evaluation_id = ev.evaluation_id
	           AND o.status IN ('waiting', 'queued', 'building') AND o.id NOT IN (SELECT id FROM b) LIMIT $4) x) AS others
	      FROM (SELECT DISTINCT evaluation_id FROM b WHERE $5::boolean) ev)
	SELECT b.assignment_id, b.evaluation_id, b.project_id, d.ids, COALESCE(o.others, $4)
	FROM b LEFT JOIN d ON d.assignment_id = b.assignment_id LEFT JOIN o ON o.evaluation_id = b.evaluation_id`

type completeCall struct {
	assignmentID, info string
	// end: check whether the build was its evaluation's last (CompleteBuild;
	// CompleteBuildDeferEnd leaves that to its caller).
	end bool
}

// completion is what the completing statement reports of one build.
type completion struct {
	closed           bool
	evalID, project  string
	dependents       string // comma-separated build IDs
	othersStillToRun int    // capped at finishCheckBound
}

func (pg *postgres) newCompletionBatcher() *sqldb.Batcher[completeCall, completion] {
	return &sqldb.Batcher[completeCall, completion]{Max: maxBatch, Lanes: batchLanes, Run: pg.completeBatch}
}

// completeBatch runs completeBuildsSQL (completeBuildSQL for one
// call); a call whose assignment completed nothing gets a completion that
// is not closed.
func (pg *postgres) completeBatch(ctx context.Context, calls []completeCall) ([]completion, error) {
	end := false
	for _, c := range calls {
		end = end || c.end
	}
	if len(calls) == 1 {
		var (
			closed                      int
			evalID, project, dependents sql.NullString
			c                           completion
		)
		err := retryingStatement(func() error {
			return pg.keyedRow(ctx, completeBuildSQL, calls[0].assignmentID, sqldb.NowMillis(), calls[0].info, finishCheckBound, end).
				Scan(&closed, &evalID, &project, &dependents, &c.othersStillToRun)
		})
		c.closed, c.evalID, c.project, c.dependents = closed > 0, evalID.String, project.String, dependents.String
		return []completion{c}, err
	}
	ids, infos := make([]string, len(calls)), make([]string, len(calls))
	for i, c := range calls {
		ids[i], infos[i] = c.assignmentID, c.info
	}
	st, err := pg.preparedOn(ctx, pg.keyed, completeBuildsSQL)
	if err != nil {
		return nil, err
	}
	var done map[string]completion
	err = retryingStatement(func() error {
		done, err = scanCompletions(st.QueryContext(ctx, ids, infos, sqldb.NowMillis(), finishCheckBound, end))
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]completion, len(calls))
	for i, c := range calls {
		out[i] = done[c.assignmentID]
		delete(done, c.assignmentID) // a second call for it finds it closed
	}
	return out, nil
}

func scanCompletions(rows *sql.Rows, err error) (map[string]completion, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	done := map[string]completion{}
	checked := map[string]bool{} // evaluations one call already checks
	for rows.Next() {
		var id string
		var deps sql.NullString
		c := completion{closed: true}
		if err := rows.Scan(&id, &c.evalID, &c.project, &deps, &c.othersStillToRun); err != nil {
			return nil, err
		}
		c.dependents = deps.String
		// One "is the evaluation done?" check per evaluation and batch
		// is enough: the count leaves out the batch.
		if checked[c.evalID] {
			c.othersStillToRun = finishCheckBound
		}
		checked[c.evalID] = true
		done[id] = c
	}
	return done, rows.Err()
}

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

// completeBuild is CompleteBuild on PostgreSQL, without a transaction
// around the steps: each statement is atomic, and each later step
// re-checks what it depends on. A crash between the steps leaves work
// that RecoverInterruptedWork finishes (ReadyStrandedBuilds,
// FinishDoneEvaluations).
func (pg *postgres) completeBuild(ctx context.Context, assignmentID, info string, end bool) ([]string, error) {
	c, err := pg.completions.Do(ctx, completeCall{assignmentID, info, end})
	if err != nil {
		return nil, err
	}
	if !c.closed {
		return nil, pg.explainNotCompletable(ctx, assignmentID)
	}
	now := sqldb.NowMillis()
	var ready []string
	if c.dependents != "" {
		rows, err := pg.sql.QueryContext(ctx, readyDependentsPG, c.evalID, strings.Split(c.dependents, ","), c.project, now)
		if ready, err = sqldb.Collect(rows, err, scanString); err != nil {
			return nil, fmt.Errorf("build recorded; readying its dependents failed (ReadyStrandedBuilds retries): %w", err)
		}
	}
	if len(ready) > 0 || !end || c.othersStillToRun >= finishCheckBound {
		return ready, nil
	}
	// Without a lock: of two last builds completing at once, the later
	// commit sees both done (and the status check ends it only once).
	// Builds still to run that a completion's snapshot shows can only be
	// completions running at the same time: at most one per connection,
	// or a whole batch in another lane (a batch's count leaves out its own
	// builds), so the last one always sees fewer than finishCheckBound
	// and checks.
	if _, err := pg.exec(ctx, finishEvaluationSQL, c.evalID, sqldb.NowMillis()); err != nil {
		return ready, fmt.Errorf("build recorded; ending its evaluation failed (the next pass retries): %w", err)
	}
	return ready, nil
}

// finishCheckBound: a completion that sees this many other builds of its
// evaluation still to run cannot be the last one (see completeBuild).
const finishCheckBound = sqldb.PostgresMaxConns + (batchLanes-1)*maxBatch + 1

// explainNotCompletable names why an assignment could not complete a
// build: closed, unknown, of a flake job, or its job not assigned.
func (pg *postgres) explainNotCompletable(ctx context.Context, assignmentID string) error {
	var jobID string
	var closedAt sql.NullInt64
	err := pg.sql.QueryRowContext(ctx, `SELECT job_id, closed_at FROM job_assignments WHERE id = $1`, assignmentID).Scan(&jobID, &closedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return sqldb.NotFound("assignment %s", assignmentID)
	}
	if err != nil {
		return err
	}
	if closedAt.Valid {
		return sqldb.Conflict("assignment %s is closed", assignmentID)
	}
	var kind storage.JobKind
	var status storage.JobStatus
	if err := pg.sql.QueryRowContext(ctx, `SELECT kind, status FROM jobs WHERE id = $1`, jobID).Scan(&kind, &status); err != nil {
		return err
	}
	if kind != storage.JobBuild {
		return sqldb.Invalid("assignment %s is of a flake job", assignmentID)
	}
	return sqldb.Conflict("job %s is %s, not assigned", jobID, status)
}

// queueBuildsByID runs update once, with the IDs as one array, and no
// sequential scan in the transaction (see queueBuildsByID).
func (pg *postgres) queueBuildsByID(ctx context.Context, tx *sql.Tx, update, evalID string, ids []string) ([]string, error) {
	if _, err := pg.txExec(ctx, tx, `SET LOCAL enable_seqscan = off`); err != nil {
		return nil, err
	}
	rows, err := pg.txQuery(ctx, tx, update+`= ANY($2::text[]) RETURNING id`, evalID, ids)
	return sqldb.Collect(rows, err, scanString)
}

// insertBuildJobs inserts every job in one statement with arrays: an
// evaluation may ready thousands.
func (pg *postgres) insertBuildJobs(ctx context.Context, tx *sql.Tx, job jobRef, ids, builds []string, now int64) error {
	_, err := pg.txExec(ctx, tx,
		`INSERT INTO jobs (id, kind, evaluation_id, build_id, project_id, status, ready_at, attempts, created_at)
			 SELECT u.id, 'build', $1, u.build_id, $2, 'pending', $3, 0, $3
			 FROM unnest($4::text[], $5::text[]) AS u(id, build_id)`,
		job.evalID, job.projectID, now, ids, builds)
	return err
}

// durableTx is jobTx: PostgreSQL commits durably by default.
func (pg *postgres) durableTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return pg.jobTx(ctx, fn)
}

// lazyCommit lets the transaction commit without waiting for its WAL
// flush (synchronous_commit off, for this transaction only). Used for the
// hot state changes of running work (claim, complete, fail, release): a
// crash may lose the last few of them, but the WAL keeps transactions in
// order, so what survives is a consistent earlier state, and
// RecoverInterruptedWork turns its open assignments back into pending
// jobs. Creating evaluations (the queued work itself) and cancelling them
// stay synchronous (durableJobTx).
func (pg *postgres) lazyCommit(ctx context.Context, tx *sql.Tx) error {
	_, err := pg.txExec(ctx, tx, `SELECT set_config('synchronous_commit', 'off', true)`)
	return err
}

// forUpdate locks the rows a SELECT reads: concurrent completions in one
// evaluation serialise on them.
func (*postgres) forUpdate() string { return ` FOR UPDATE` }

// lockEvaluation locks the evaluation row, so that of two last builds
// completing at once the later one sees the other's result (the UPDATE
// after the lock reads a fresh snapshot).
func (pg *postgres) lockEvaluation(ctx context.Context, tx *sql.Tx, evalID string) error {
	var one int
	return pg.txRow(ctx, tx, `SELECT 1 FROM evaluations WHERE id = $1 FOR UPDATE`, evalID).Scan(&one)
}

// edgesByDependency leaves the choice of index to the planner, which has
// statistics.
func (*postgres) edgesByDependency() string { return "build_edges e" }

// discoveredInserts take many rows per statement: one round trip each.
func (*postgres) discoveredInserts(context.Context) (discoveredInserts, error) {
	return discoveredInserts{buildsPer: 100, edgesPer: 300}, nil
}

// queryByIDs runs query once, with the IDs as one array parameter (a
// prepared statement: IN lists of hundreds of parameters are planned anew
// on every call).
func (pg *postgres) queryByIDs(ctx context.Context, pool *sql.DB, query string, ids []string, collect func(*sql.Rows, error) error) error {
	st, err := pg.preparedOn(ctx, pool, fmt.Sprintf(query, "= ANY($1::text[])"))
	if err != nil {
		return err
	}
	return collect(st.QueryContext(ctx, ids))
}
