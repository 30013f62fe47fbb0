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

// Assignment outcomes recorded by the queue itself.
const (
	OutcomeCompleted      = "completed"
	OutcomeFetched        = "fetched"
	OutcomeDeclined       = "declined"
	OutcomeWorkerLost     = "worker lost"
	OutcomeServerRestart  = "server restarted"
	OutcomeInstanceLost   = "server instance lost"
	OutcomeCancelled      = "cancelled"
	outcomeFailedPrefix   = "failed: "
	dependencyFailedError = "dependency failed: "
)

// claimedEvaluationStatus is the status of an evaluation whose flake job
// is claimed: fetching, or evaluating once its source is fetched (the
// follow-up of a fetch-only job, a retry).
const claimedEvaluationStatus = `CASE WHEN evaluations.flake_source IS NULL THEN 'fetching' ELSE 'evaluating' END`

// ClaimJob hands a pending job to a worker by opening an assignment, and
// returns the assignment's ID. A job that is not pending, or already has
// an open assignment, is ErrConflict; an unknown job ErrNotFound. The job
// becomes assigned; a build job's build becomes building, a flake job's
// evaluation fetching (evaluating, when its source is fetched already).
// The attempt counts until it is released.
func (q *Queue) ClaimJob(ctx context.Context, jobID, workerID string) (string, error) {
	jobID, err := sqldb.CanonicalUUID("job ID", jobID)
	if err != nil {
		return "", err
	}
	workerID, err = sqldb.CanonicalUUID("worker ID", workerID)
	if err != nil {
		return "", err
	}
	assignmentID := storage.NewID()
	if err := q.engine.claim(ctx, jobID, workerID, assignmentID); err != nil {
		return "", err
	}
	return assignmentID, nil
}

// jobMissing is the error for a job a statement did not find in the state
// it wanted: ErrNotFound when the job does not exist, else ErrConflict.
func (q *Queue) jobMissing(ctx context.Context, tx *sql.Tx, jobID, why string) error {
	ok, err := sqldb.Exists(ctx, tx, `SELECT 1 FROM jobs WHERE id = $1`, jobID)
	if err != nil {
		return err
	}
	if !ok {
		return sqldb.NotFound("job %s", jobID)
	}
	return sqldb.Conflict("job %s %s", jobID, why)
}

// closeAssignment closes an open assignment and returns its job. A closed
// assignment is ErrConflict, an unknown one ErrNotFound.
func (q *Queue) closeAssignment(ctx context.Context, tx *sql.Tx, assignmentID, outcome string) (string, error) {
	var jobID string
	err := q.txRow(ctx, tx,
		`UPDATE job_assignments SET closed_at = $2, outcome = $3
		 WHERE id = $1 AND closed_at IS NULL RETURNING job_id`,
		assignmentID, sqldb.NowMillis(), outcome).Scan(&jobID)
	if errors.Is(err, sql.ErrNoRows) {
		ok, err := sqldb.Exists(ctx, tx, `SELECT 1 FROM job_assignments WHERE id = $1`, assignmentID)
		if err != nil {
			return "", err
		}
		if !ok {
			return "", sqldb.NotFound("assignment %s", assignmentID)
		}
		return "", sqldb.Conflict("assignment %s is closed", assignmentID)
	}
	return jobID, err
}

// requeue makes an assigned job pending again; its build becomes queued,
// or its evaluation queued. uncount takes back the attempt the claim
// counted. readyAt, when set, moves the job to the back of the queue.
// failure, when set, is recorded as the last failure. A job that is not
// assigned (cancelled meanwhile) is left alone.
func (q *Queue) requeue(ctx context.Context, tx *sql.Tx, jobID string, uncount bool, readyAt *int64, failure *jobFailure) (kind storage.JobKind, attempts int, changed bool, err error) {
	back := 0
	if uncount {
		back = 1
	}
	var buildID sql.NullString
	var evalID string
	err = q.txRow(ctx, tx,
		`UPDATE jobs SET status = 'pending', attempts = CASE WHEN attempts >= $2 THEN attempts - $2 ELSE 0 END,
		 ready_at = COALESCE($3, ready_at)
		 WHERE id = $1 AND status = 'assigned' RETURNING kind, build_id, evaluation_id, attempts`,
		jobID, back, readyAt).Scan(&kind, &buildID, &evalID, &attempts)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, err
	}
	var failureKind, message any
	if failure != nil {
		failureKind, message = string(failure.kind), failure.message
	}
	if kind == storage.JobBuild {
		_, err = q.txExec(ctx, tx,
			`UPDATE builds SET status = 'queued', attempts = CASE WHEN attempts >= $2 THEN attempts - $2 ELSE 0 END,
			 failure_kind = COALESCE($3, failure_kind), error = COALESCE($4, error)
			 WHERE id = $1 AND status = 'building'`,
			buildID.String, back, failureKind, message)
	} else {
		_, err = q.txExec(ctx, tx,
			`UPDATE evaluations SET status = 'queued', attempts = CASE WHEN attempts >= $2 THEN attempts - $2 ELSE 0 END,
			 error = COALESCE($3, error)
			 WHERE id = $1 AND status IN ('fetching', 'evaluating')`,
			evalID, back, message)
	}
	return kind, attempts, true, err
}

type jobFailure struct {
	kind    storage.FailureKind
	message string
}

// ReleaseAssignment closes an open assignment whose job did not run to an
// end (declined, worker lost, aborted) and returns the job to the pending
// pool, keeping its place (ready_at); the attempt does not count. Its build
// becomes queued again, its evaluation queued. An assignment closed
// already is left as it is, without error.
func (q *Queue) ReleaseAssignment(ctx context.Context, assignmentID, outcome string) error {
	assignmentID, err := sqldb.CanonicalUUID("assignment ID", assignmentID)
	if err != nil {
		return err
	}
	return q.jobTx(ctx, func(tx *sql.Tx) error {
		jobID, err := q.closeAssignment(ctx, tx, assignmentID, outcome)
		if err := q.engine.lazyCommit(ctx, tx); err != nil {
			return err
		}
		if errors.Is(err, storage.ErrConflict) {
			return nil
		}
		if err != nil {
			return err
		}
		_, _, _, err = q.requeue(ctx, tx, jobID, true, nil, nil)
		return err
	})
}

// ReleaseLostAssignment closes the open assignment of a worker whose
// session ended without a report (disconnect, heartbeat timeout) and
// returns the job to the pending pool in its place, the attempt not
// counted, as ReleaseAssignment does. The job's lost-worker count grows;
// at maxLost in a row the job fails for good instead (permanent failure,
// cascading as FailJob), and failed is true. An assignment closed
// already is left as it is, without error.
func (q *Queue) ReleaseLostAssignment(ctx context.Context, assignmentID string, maxLost int) (failed bool, err error) {
	assignmentID, err = sqldb.CanonicalUUID("assignment ID", assignmentID)
	if err != nil {
		return false, err
	}
	maxLost = max(maxLost, 1)
	err = q.jobTx(ctx, func(tx *sql.Tx) error {
		failed = false
		if err := q.engine.lazyCommit(ctx, tx); err != nil {
			return err
		}
		jobID, err := q.closeAssignment(ctx, tx, assignmentID, OutcomeWorkerLost)
		if errors.Is(err, storage.ErrConflict) {
			return nil
		}
		if err != nil {
			return err
		}
		var lost int
		err = q.txRow(ctx, tx, `UPDATE jobs SET lost_workers = lost_workers + 1
			WHERE id = $1 AND status = 'assigned' RETURNING lost_workers`, jobID).Scan(&lost)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // not running any more (cancelled meanwhile)
		}
		if err != nil {
			return err
		}
		if lost < maxLost {
			_, _, _, err = q.requeue(ctx, tx, jobID, true, nil, nil)
			return err
		}
		failed = true
		return q.failJob(ctx, tx, jobID, storage.FailurePermanent,
			fmt.Sprintf("%d workers in a row were lost while running it (does it crash or exhaust the worker?)", lost))
	})
	return failed, err
}

// AddEvaluationErrors records errors an evaluation reported while it runs
// (attributes that failed to evaluate, targets that matched nothing). The
// evaluation still builds what it found, then ends failed with them.
func (q *Queue) AddEvaluationErrors(ctx context.Context, evalID string, errs []string) error {
	if len(errs) == 0 {
		return nil
	}
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return err
	}
	_, err = q.exec(ctx, `UPDATE evaluations
		SET eval_errors = COALESCE(eval_errors || CAST($2 AS TEXT), '') || CAST($3 AS TEXT)
		WHERE id = $1 AND status IN ('queued', 'fetching', 'evaluating')`,
		evalID, "\n", strings.Join(errs, "\n"))
	return err
}

// SetEvaluationStatus records a fetching → evaluating step a worker
// reported. Only an evaluation whose flake job runs (fetching or
// evaluating) may change; any other is ErrConflict.
func (q *Queue) SetEvaluationStatus(ctx context.Context, evalID string, status storage.EvaluationStatus) error {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return err
	}
	if status != storage.EvaluationFetching && status != storage.EvaluationEvaluating {
		return sqldb.Invalid("evaluation status %q cannot be reported by a worker", status)
	}
	res, err := q.exec(ctx,
		`UPDATE evaluations SET status = $2 WHERE id = $1 AND status IN ('fetching', 'evaluating')`,
		evalID, string(status))
	if err := sqldb.AffectedOne(res, err, "running evaluation %s", evalID); err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			if ok, qerr := sqldb.Exists(ctx, q.sql, `SELECT 1 FROM evaluations WHERE id = $1`, evalID); qerr == nil && ok {
				return sqldb.Conflict("evaluation %s is not running", evalID)
			}
		}
		return err
	}
	return nil
}

// SetFlakeSource records the fetched source store path of an evaluation.
func (q *Queue) SetFlakeSource(ctx context.Context, evalID, storePath string) error {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return err
	}
	res, err := q.exec(ctx,
		`UPDATE evaluations SET flake_source = $2 WHERE id = $1`, evalID, storePath)
	return sqldb.AffectedOne(res, err, "evaluation %s", evalID)
}

// AddDiscoveredDerivations stores a batch of derivations an evaluation
// reported, as waiting builds with their dependency edges. Batches may
// come in any order and may repeat: a derivation already stored keeps its
// row, except that a non-empty attr fills an empty one. Only an evaluation
// whose flake job runs accepts derivations (else ErrConflict).
func (q *Queue) AddDiscoveredDerivations(ctx context.Context, evalID string, drvs []storage.DiscoveredBuild) error {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return err
	}
	type row struct {
		args  []any
		drv   string
		edges []string
	}
	var list []*row
	byPath := map[string]*row{}
	now := sqldb.NowMillis()
	for _, d := range drvs {
		if strings.TrimSpace(d.DrvPath) == "" {
			return sqldb.Invalid("discovered derivation without a drv path")
		}
		if r, dup := byPath[d.DrvPath]; dup {
			if r.args[3] == "" && d.Attr != "" {
				r.args[3] = d.Attr
			}
			r.edges = append(r.edges, d.Dependencies...)
			continue
		}
		features, err := stringsJSON(d.RequiredFeatures)
		if err != nil {
			return err
		}
		outputs := d.Outputs
		if outputs == nil {
			outputs = []storage.BuildOutputPath{}
		}
		outputsText, err := sqldb.JSONText(outputs)
		if err != nil {
			return err
		}
		timeout, err := uintArg("timeout_secs", d.TimeoutSecs)
		if err != nil {
			return err
		}
		silent, err := uintArg("max_silent_secs", d.MaxSilentSecs)
		if err != nil {
			return err
		}
		r := &row{
			drv:   d.DrvPath,
			edges: append([]string{}, d.Dependencies...),
			args: []any{storage.NewID(), evalID, d.DrvPath, d.Attr, d.Architecture, features, outputsText,
				timeout, silent, d.IsFixedOutput, d.PreferLocalBuild, now},
		}
		byPath[d.DrvPath] = r
		list = append(list, r)
	}
	var edges [][2]string
	seen := map[[2]string]bool{}
	for _, r := range list {
		for _, dep := range r.edges {
			e := [2]string{r.drv, dep}
			if dep == "" || dep == r.drv || seen[e] {
				continue
			}
			seen[e] = true
			edges = append(edges, e)
		}
	}
	// Rows per statement by engine (discoveredInserts); statements are
	// prepared before the transaction: preparing needs a connection of
	// its own (see prepared).
	ins, err := q.engine.discoveredInserts(ctx)
	if err != nil {
		return err
	}
	buildsPer, edgesPer, insertBuild, insertEdge := ins.buildsPer, ins.edgesPer, ins.build, ins.edge
	return q.jobTx(ctx, func(tx *sql.Tx) error {
		var status storage.EvaluationStatus
		err := tx.QueryRowContext(ctx,
			`SELECT status FROM evaluations WHERE id = $1`+q.engine.forUpdate(), evalID).Scan(&status)
		if errors.Is(err, sql.ErrNoRows) {
			return sqldb.NotFound("evaluation %s", evalID)
		}
		if err != nil {
			return err
		}
		if status != storage.EvaluationFetching && status != storage.EvaluationEvaluating {
			return sqldb.Conflict("evaluation %s is %s, not evaluating", evalID, status)
		}
		builds, edgeRows := txStatement(ctx, tx, insertBuild), txStatement(ctx, tx, insertEdge)
		for start := 0; start < len(list); start += buildsPer {
			chunk := list[start:min(start+buildsPer, len(list))]
			args := make([]any, 0, len(chunk)*discoveredBuildColumns)
			for _, r := range chunk {
				args = append(args, r.args...)
			}
			if err := builds.exec(discoveredBuildsSQL, len(chunk), args); err != nil {
				return err
			}
		}
		for start := 0; start < len(edges); start += edgesPer {
			chunk := edges[start:min(start+edgesPer, len(edges))]
			args := make([]any, 0, 1+2*len(chunk))
			args = append(args, evalID)
			for _, e := range chunk {
				args = append(args, e[0], e[1])
			}
			if err := edgeRows.exec(discoveredEdgesSQL, len(chunk), args); err != nil {
				return err
			}
		}
		return nil
	})
}

// discoveredBuildColumns is how many arguments a row of
// discoveredBuildsSQL takes.
const discoveredBuildColumns = 12

// discoveredBuildsSQL is the INSERT of rows waiting builds
// (AddDiscoveredDerivations).
func discoveredBuildsSQL(rows int) string {
	var sb strings.Builder
	sb.WriteString(`INSERT INTO builds (id, evaluation_id, drv_path, attr, architecture, required_features,
				outputs, timeout_secs, max_silent_secs, is_fixed_output, prefer_local_build, created_at,
				status, attempts) VALUES `)
	for i := range rows {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(")
		for j := range discoveredBuildColumns {
			fmt.Fprintf(&sb, "$%d, ", i*discoveredBuildColumns+j+1)
		}
		sb.WriteString("'waiting', 0)")
	}
	sb.WriteString(` ON CONFLICT (evaluation_id, drv_path) DO UPDATE SET attr = excluded.attr
				WHERE builds.attr = '' AND excluded.attr <> ''`)
	return sb.String()
}

// discoveredEdgesSQL is the INSERT of rows dependency edges of one
// evaluation ($1).
func discoveredEdgesSQL(rows int) string {
	var sb strings.Builder
	sb.WriteString(`INSERT INTO build_edges (evaluation_id, drv_path, dependency_drv_path) VALUES `)
	for i := range rows {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "($1, $%d, $%d)", 2*i+2, 2*i+3)
	}
	sb.WriteString(` ON CONFLICT DO NOTHING`)
	return sb.String()
}

// txInsert runs a statement of a transaction: through a prepared one when
// there is one (its shape is fixed), else the SQL built for the rows.
type txInsert struct {
	ctx      context.Context
	tx       *sql.Tx
	prepared *sql.Stmt // in tx; nil: build the SQL per call
}

func txStatement(ctx context.Context, tx *sql.Tx, st *sql.Stmt) txInsert {
	t := txInsert{ctx: ctx, tx: tx}
	if st != nil {
		t.prepared = tx.StmtContext(ctx, st)
	}
	return t
}

func (t txInsert) exec(query func(rows int) string, rows int, args []any) error {
	var err error
	if t.prepared != nil {
		_, err = t.prepared.ExecContext(t.ctx, args...)
	} else {
		_, err = t.tx.ExecContext(t.ctx, query(rows), args...)
	}
	return err
}

// jobRef is what ending a job tells about it: its kind, evaluation,
// project, build and attempts so far.
type jobRef struct {
	kind      storage.JobKind
	evalID    string
	projectID string
	buildID   string
	attempts  int
}

// endJob marks an assigned job done (or failed) and returns it.
func (q *Queue) endJob(ctx context.Context, tx *sql.Tx, jobID string, status storage.JobStatus) (jobRef, error) {
	var j jobRef
	var buildID sql.NullString
	err := q.txRow(ctx, tx,
		`UPDATE jobs SET status = $2 WHERE id = $1 AND status = 'assigned'
		 RETURNING kind, evaluation_id, project_id, build_id, attempts`,
		jobID, string(status)).Scan(&j.kind, &j.evalID, &j.projectID, &buildID, &j.attempts)
	if errors.Is(err, sql.ErrNoRows) {
		return j, q.jobMissing(ctx, tx, jobID, "is not assigned")
	}
	j.buildID = buildID.String
	return j, err
}

// readyNow: the build (the UPDATE's row) may be queued once its
// evaluation finished evaluating; before, when an import from derivation
// needs it, or when every input is known built (streamCondition: builds
// stream while the evaluation goes on, docs/protocol/jobs.md §9.1).
const readyNow = `(builds.for_import OR EXISTS (SELECT 1 FROM evaluations v
	WHERE v.id = builds.evaluation_id AND v.status = 'building') OR (EXISTS (SELECT 1 FROM evaluations v
	WHERE v.id = builds.evaluation_id AND v.status IN ('fetching', 'evaluating')) AND ` + streamCondition + `))`

// readyCondition: the build (the UPDATE's row) has no dependency among
// the evaluation's builds that is not succeeded.
const readyCondition = `NOT EXISTS (SELECT 1 FROM build_edges e
	JOIN builds d ON d.evaluation_id = e.evaluation_id AND d.drv_path = e.dependency_drv_path
	WHERE e.evaluation_id = builds.evaluation_id AND e.drv_path = builds.drv_path AND d.status <> 'succeeded')`

// CompleteFlakeJob ends a flake job's assignment successfully and returns
// the build jobs it made pending: the evaluation moves to building, and
// every waiting build whose dependencies are all built is queued. An
// evaluation without builds succeeds at once. An assignment that is not
// open is ErrConflict. It is CompleteFlakeJobChunk, then ReadyCandidates
// and QueueReadyBuilds in chunks: a crash part-way leaves the rest to
// ReadyStrandedBuilds at the next start.
func (q *Queue) CompleteFlakeJob(ctx context.Context, assignmentID string) ([]string, error) {
	ready, evalID, more, err := q.CompleteFlakeJobChunk(ctx, assignmentID, ReadyChunk)
	if !more || err != nil {
		return ready, err
	}
	rest, err := q.ReadyCandidates(ctx, evalID)
	for len(rest) > 0 && err == nil {
		n := min(len(rest), ReadyChunk)
		var next []string
		next, err = q.QueueReadyBuilds(ctx, evalID, rest[:n])
		ready, rest = append(ready, next...), rest[n:]
	}
	return ready, err
}

// ReadyChunk is how many builds one transaction of an evaluation's
// readying queues (CompleteFlakeJobChunk, QueueReadyBuilds): the
// first ones are assignable while the rest are still being queued.
const ReadyChunk = 1000

// CompleteFlakeJobChunk ends a flake job's assignment successfully, moves
// the evaluation to building and queues at most limit of its waiting
// builds whose dependencies are all built, in one transaction. It returns
// their pending jobs, the evaluation, and whether more builds may be
// ready: then the caller queues them with ReadyCandidates and
// QueueReadyBuilds (a crash
// before it does leaves them to ReadyStrandedBuilds at the next start). An
// evaluation without ready builds ends at once (succeeded without builds,
// failed with evaluation errors). An assignment that is not open is
// ErrConflict.
func (q *Queue) CompleteFlakeJobChunk(ctx context.Context, assignmentID string, limit int) (ready []string, evalID string, more bool, err error) {
	assignmentID, err = sqldb.CanonicalUUID("assignment ID", assignmentID)
	if err != nil {
		return nil, "", false, err
	}
	limit = max(limit, 1)
	err = q.jobTx(ctx, func(tx *sql.Tx) error {
		ready = nil
		job, err := q.completeAssignment(ctx, tx, assignmentID, storage.JobFlake)
		if err != nil {
			return err
		}
		evalID = job.evalID
		if _, err := q.txExec(ctx, tx,
			`UPDATE evaluations SET status = 'building', error = NULL
			 WHERE id = $1 AND status IN ('queued', 'fetching', 'evaluating')`, job.evalID); err != nil {
			return err
		}
		// The first builds the index gives, without sorting the whole
		// evaluation: the rest follow by primary key.
		rows, err := q.txQuery(ctx, tx,
			`UPDATE builds SET status = 'queued' WHERE status = 'waiting' AND id IN
			 (SELECT id FROM builds WHERE evaluation_id = $1 AND status = 'waiting' AND `+readyCondition+` LIMIT $2)
			 RETURNING id`, job.evalID, limit)
		builds, err := sqldb.Collect(rows, err, scanString)
		if err != nil {
			return err
		}
		more = len(builds) == limit
		if ready, err = q.insertBuildJobs(ctx, tx, job, builds); err != nil {
			return err
		}
		if len(ready) == 0 {
			return q.finishEvaluationIfDone(ctx, tx, job.evalID)
		}
		return nil
	})
	return ready, evalID, more, err
}

// ReadyCandidates returns the waiting builds of a building evaluation
// whose dependencies are all built: what QueueReadyBuilds may queue. It
// reads without a lock, in one pass; nothing for an evaluation that is
// not building.
func (q *Queue) ReadyCandidates(ctx context.Context, evalID string) ([]string, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	rows, err := q.sql.QueryContext(ctx, `SELECT id FROM builds WHERE evaluation_id = $1 AND status = 'waiting' AND `+
		readyCondition+` AND EXISTS (SELECT 1 FROM evaluations v WHERE v.id = $1 AND v.status = 'building')`, evalID)
	return sqldb.Collect(rows, err, scanString)
}

// QueueReadyBuilds queues, in one transaction, those of the builds ids of
// a building evaluation that are still waiting with every dependency
// built (ReadyCandidates), and returns their pending jobs. It selects by
// primary key, so a call costs the same however many builds the
// evaluation has: an evaluation's builds are queued in chunks, each
// assignable as soon as its transaction commits.
func (q *Queue) QueueReadyBuilds(ctx context.Context, evalID string, ids []string) ([]string, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, nil
	}
	var ready []string
	err = q.jobTx(ctx, func(tx *sql.Tx) error {
		ready = nil
		if err := q.engine.lazyCommit(ctx, tx); err != nil {
			return err
		}
		var project string
		err := q.txRow(ctx, tx, `SELECT project_id FROM evaluations WHERE id = $1 AND status = 'building'`, evalID).Scan(&project)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // ended or cancelled meanwhile
		}
		if err != nil {
			return err
		}
		builds, err := q.queueBuildsByID(ctx, tx, evalID, ids)
		if err != nil {
			return err
		}
		ready, err = q.insertBuildJobs(ctx, tx, jobRef{kind: storage.JobBuild, evalID: evalID, projectID: project}, builds)
		return err
	})
	return ready, err
}

// queueBuildsByID queues those of the builds ids (of evaluation evalID)
// that are waiting with every dependency built, and returns them.
func (q *Queue) queueBuildsByID(ctx context.Context, tx *sql.Tx, evalID string, ids []string) ([]string, error) {
	// The chunk's builds are looked up by key, whatever the statistics
	// say: given the evaluation and status plainly, PostgreSQL's planner
	// (with the statistics of builds inserted moments ago) scans the
	// evaluation's waiting builds and filters them by the list, and
	// given them in a CASE, which no index serves, it scans the table;
	// either way each chunk would cost as much as all of them. So the
	// CASE, and no sequential scan in this transaction.
	const update = `UPDATE builds SET status = 'queued'
		WHERE CASE WHEN evaluation_id = $1 AND status = 'waiting' THEN true ELSE false END AND ` +
		readyCondition + ` AND id `
	return q.engine.queueBuildsByID(ctx, tx, update, evalID, ids)
}

// CompleteFetch ends a fetch-only assignment of a flake job (docs/protocol/jobs.md §6,
// flake-job splitting): the job is pending again, in its place and without
// counting the attempt, for a worker to evaluate the fetched source. The
// evaluation must have its source recorded (FetchResult), else nothing
// changes and the error is ErrInvalid. An assignment that is not open is
// ErrConflict.
func (q *Queue) CompleteFetch(ctx context.Context, assignmentID string) error {
	assignmentID, err := sqldb.CanonicalUUID("assignment ID", assignmentID)
	if err != nil {
		return err
	}
	return q.jobTx(ctx, func(tx *sql.Tx) error {
		if err := q.engine.lazyCommit(ctx, tx); err != nil {
			return err
		}
		jobID, err := q.closeAssignment(ctx, tx, assignmentID, OutcomeFetched)
		if err != nil {
			return err
		}
		// The fetching worker survived: the count of lost workers starts over.
		var kind storage.JobKind
		var source sql.NullString
		if err := q.txRow(ctx, tx, `UPDATE jobs SET lost_workers = 0 WHERE id = $1
			RETURNING kind, (SELECT flake_source FROM evaluations e WHERE e.id = jobs.evaluation_id)`, jobID).Scan(&kind, &source); err != nil {
			return err
		}
		if kind != storage.JobFlake {
			return sqldb.Invalid("assignment %s is of a %s job, not a flake job", assignmentID, kind)
		}
		if !source.Valid || source.String == "" {
			return sqldb.Invalid("the fetch of assignment %s completed without a FetchResult naming the source", assignmentID)
		}
		_, _, _, err = q.requeue(ctx, tx, jobID, true, nil, nil)
		return err
	})
}

// completeAssignment closes an open assignment as completed and ends its
// job as done, which must be of kind.
func (q *Queue) completeAssignment(ctx context.Context, tx *sql.Tx, assignmentID string, kind storage.JobKind) (jobRef, error) {
	if err := q.engine.lazyCommit(ctx, tx); err != nil {
		return jobRef{}, err
	}
	jobID, err := q.closeAssignment(ctx, tx, assignmentID, OutcomeCompleted)
	if err != nil {
		return jobRef{}, err
	}
	job, err := q.endJob(ctx, tx, jobID, storage.JobDone)
	if err != nil {
		return jobRef{}, err
	}
	if job.kind != kind {
		return jobRef{}, sqldb.Invalid("assignment %s is of a %s job, not a %s job", assignmentID, job.kind, kind)
	}
	return job, nil
}

// CompleteBuild ends a build job's assignment successfully: the build
// succeeded with outputs, its dependents whose dependencies are now all
// built become queued, and the jobs made pending are returned. When every
// build of the evaluation has ended, the evaluation succeeds, or fails if
// any build failed. An assignment that is not open is ErrConflict.
func (q *Queue) CompleteBuild(ctx context.Context, assignmentID string, outputs []storage.BuildOutputInfo) ([]string, error) {
	return q.completeBuild(ctx, assignmentID, outputs, true)
}

// CompleteBuildDeferEnd is CompleteBuild without the check whether the
// build was its evaluation's last: the caller knows which builds of the
// evaluation are still to run (the scheduler's queue) and calls
// EndEvaluationIfDone after the last one. That check reads the
// evaluation's builds still to run, whose index grows with every state
// change until the table is vacuumed; skipped, a completion costs the
// same however large the evaluation. An evaluation left building by a
// caller that did not check ends in FinishDoneEvaluations (every
// scheduler pass and at start).
func (q *Queue) CompleteBuildDeferEnd(ctx context.Context, assignmentID string, outputs []storage.BuildOutputInfo) ([]string, error) {
	return q.completeBuild(ctx, assignmentID, outputs, false)
}

// EndEvaluationIfDone ends a building evaluation none of whose builds is
// left to run (succeeded, or failed when a build failed or the evaluation
// reported errors) and reports whether it did.
func (q *Queue) EndEvaluationIfDone(ctx context.Context, evalID string) (bool, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return false, err
	}
	res, err := q.exec(ctx, finishEvaluationSQL, evalID, sqldb.NowMillis())
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

func (q *Queue) completeBuild(ctx context.Context, assignmentID string, outputs []storage.BuildOutputInfo, end bool) ([]string, error) {
	assignmentID, err := sqldb.CanonicalUUID("assignment ID", assignmentID)
	if err != nil {
		return nil, err
	}
	if outputs == nil {
		outputs = []storage.BuildOutputInfo{}
	}
	info, err := sqldb.JSONText(outputs)
	if err != nil {
		return nil, err
	}
	return q.engine.completeBuild(ctx, assignmentID, info, end)
}

// readyDependents queues the waiting dependents of a build that just
// succeeded whose dependencies are now all built. On PostgreSQL the
// dependents are locked first (in ID order), so of two builds completing
// at once the later one sees the earlier one succeeded.
//
// The dependents are found from the build's edges, then looked up by key:
// SQLite's planner, without statistics, otherwise walks every edge of the
// evaluation (the primary key's prefix, which covers the query) or every
// waiting build, on every completion, which costs as much as the
// evaluation is large.
func (q *Queue) readyDependents(ctx context.Context, tx *sql.Tx, evalID, drv string) ([]string, error) {
	edges := q.engine.edgesByDependency()
	rows, err := q.txQuery(ctx, tx,
		`SELECT b.id FROM `+edges+` CROSS JOIN builds b
		 WHERE e.evaluation_id = $1 AND e.dependency_drv_path = $2
		   AND b.evaluation_id = e.evaluation_id AND b.drv_path = e.drv_path AND b.status = 'waiting'
		 ORDER BY b.id`+strings.Replace(q.engine.forUpdate(), "UPDATE", "UPDATE OF b", 1), evalID, drv)
	waiting, err := sqldb.Collect(rows, err, scanString)
	if err != nil || len(waiting) == 0 {
		return nil, err
	}
	var ready []string
	for len(waiting) > 0 {
		n := min(len(waiting), sqldb.InListMax)
		args, in := sqldb.InList([]any{evalID}, waiting[:n])
		waiting = waiting[n:]
		rows, err := q.txQuery(ctx, tx,
			`UPDATE builds SET status = 'queued' WHERE id IN (`+in+`) AND evaluation_id = $1 AND status = 'waiting'
			 AND `+readyNow+` AND `+readyCondition+` RETURNING id`, args...)
		part, err := sqldb.Collect(rows, err, scanString)
		if err != nil {
			return nil, err
		}
		ready = append(ready, part...)
	}
	return ready, nil
}

// insertBuildJobs adds a pending build job per queued build.
func (q *Queue) insertBuildJobs(ctx context.Context, tx *sql.Tx, job jobRef, builds []string) ([]string, error) {
	if len(builds) == 0 {
		return nil, nil
	}
	now := sqldb.NowMillis()
	ids := make([]string, len(builds))
	for i := range ids {
		ids[i] = storage.NewID()
	}
	if len(builds) == 1 {
		_, err := q.txExec(ctx, tx,
			`INSERT INTO jobs (id, kind, evaluation_id, build_id, project_id, status, ready_at, attempts, created_at)
			 VALUES ($1, 'build', $2, $3, $4, 'pending', $5, 0, $5)`,
			ids[0], job.evalID, builds[0], job.projectID, now)
		return ids, err
	}
	return ids, q.engine.insertBuildJobs(ctx, tx, job, ids, builds, now)
}

// finishEvaluationIfDone ends a building evaluation whose builds have all
// ended: succeeded, or failed when any build failed or the evaluation
// reported errors. On PostgreSQL the
// evaluation row is locked first, so that of two last builds completing
// at once the later one sees the other's result (the UPDATE after the lock
// reads a fresh snapshot).
func (q *Queue) finishEvaluationIfDone(ctx context.Context, tx *sql.Tx, evalID string) error {
	if err := q.engine.lockEvaluation(ctx, tx, evalID); err != nil {
		return err
	}
	_, err := q.txExec(ctx, tx, finishEvaluationSQL, evalID, sqldb.NowMillis())
	return err
}

// finishEvaluationSQL ends evaluation $1 at $2 if it is building and none
// of its builds is left to run.
const finishEvaluationSQL = `UPDATE evaluations SET finished_at = $2,
	   status = CASE WHEN ` + anyBuildFailed + ` OR eval_errors IS NOT NULL THEN 'failed' ELSE 'succeeded' END,
	   error = CASE WHEN ` + anyBuildFailed + ` THEN COALESCE(error, 'builds failed')
	     WHEN eval_errors IS NOT NULL THEN COALESCE(error, eval_errors) ELSE error END
	 WHERE id = $1 AND status = 'building' AND NOT EXISTS (SELECT 1 FROM builds
	   WHERE evaluation_id = $1 AND status IN ('waiting', 'queued', 'building'))`

// ReadyStrandedBuilds queues, in every building evaluation, the waiting
// builds whose dependencies are all built. Completions ready their
// dependents right after their own commit (postgres.completeBuild); this covers a
// crash or an error between the two. It returns the jobs it made pending.
func (q *Queue) ReadyStrandedBuilds(ctx context.Context) ([]string, error) {
	rows, err := q.sql.QueryContext(ctx, `SELECT id, project_id FROM evaluations WHERE status = 'building'`)
	type evalRow struct{ id, project string }
	evals, err := sqldb.Collect(rows, err, func(r *sql.Rows) (evalRow, error) {
		var e evalRow
		return e, r.Scan(&e.id, &e.project)
	})
	if err != nil {
		return nil, err
	}
	var ready []string
	for _, e := range evals {
		err := q.jobTx(ctx, func(tx *sql.Tx) error {
			rows, err := tx.QueryContext(ctx,
				`UPDATE builds SET status = 'queued' WHERE evaluation_id = $1 AND status = 'waiting' AND `+readyCondition+
					` RETURNING id`, e.id)
			builds, err := sqldb.Collect(rows, err, scanString)
			if err != nil {
				return err
			}
			ids, err := q.insertBuildJobs(ctx, tx, jobRef{kind: storage.JobBuild, evalID: e.id, projectID: e.project}, builds)
			ready = append(ready, ids...)
			return err
		})
		if err != nil {
			return ready, err
		}
	}
	return ready, nil
}

// doneEvaluationsSQL finds the building evaluations with no build left
// to run; the partial index evaluations_building keeps it from reading
// every evaluation ever recorded.
const doneEvaluationsSQL = `SELECT e.id FROM evaluations e WHERE e.status = 'building'
	AND NOT EXISTS (SELECT 1 FROM builds WHERE evaluation_id = e.id AND status IN ('waiting', 'queued', 'building'))`

// FinishDoneEvaluations ends every building evaluation none of whose
// builds is left to run. A completion ends its evaluation right after its
// own commit (see postgres.completeBuild); this sweep covers a crash or an error
// between the two, and runs at start-up and on every scheduler pass.
func (q *Queue) FinishDoneEvaluations(ctx context.Context) (int, error) {
	rows, err := q.sql.QueryContext(ctx, doneEvaluationsSQL)
	ids, err := sqldb.Collect(rows, err, scanString)
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		if _, err := q.exec(ctx, finishEvaluationSQL, id, sqldb.NowMillis()); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

const anyBuildFailed = `EXISTS (SELECT 1 FROM builds WHERE evaluation_id = $1 AND status IN ('failed', 'dependency_failed'))`

// retryable tells the failure kinds that may succeed on another try.
func retryable(k storage.FailureKind) bool {
	return k == storage.FailureTransient || k == storage.FailureInputsUnavailable || k == storage.FailureSubstituteUnavailable
}

// FailJob ends an assignment whose job failed, for flake and build jobs:
//
//   - Aborted and Canceled release the job back to pending; the attempt
//     does not count and nothing fails.
//   - Transient, InputsUnavailable and SubstituteUnavailable re-queue the
//     job (at the back of the queue) while fewer than maxAttempts attempts
//     counted, and fail it permanently after that.
//   - Permanent, Timeout and CorruptEvalCache fail it at once.
//
// A build that fails for good makes every transitive dependent in its
// evaluation dependency_failed, and the evaluation ends when nothing is
// left to build. A flake job that fails for good fails its evaluation
// with message. It returns the jobs made pending (none so far: failures
// ready nothing) for symmetry with CompleteBuild. An assignment that is not
// open (e.g. closed by CancelEvaluation) is ErrConflict.
func (q *Queue) FailJob(ctx context.Context, assignmentID string, kind storage.FailureKind, message string, maxAttempts int) (storage.FailOutcome, []string, error) {
	assignmentID, err := sqldb.CanonicalUUID("assignment ID", assignmentID)
	if err != nil {
		return storage.FailOutcome{}, nil, err
	}
	if !kind.Valid() {
		return storage.FailOutcome{}, nil, sqldb.Invalid("unknown failure kind %q", kind)
	}
	maxAttempts = max(maxAttempts, 1)
	var out storage.FailOutcome
	err = q.jobTx(ctx, func(tx *sql.Tx) error {
		out = storage.FailOutcome{}
		if err := q.engine.lazyCommit(ctx, tx); err != nil {
			return err
		}
		jobID, err := q.closeAssignment(ctx, tx, assignmentID, outcomeFailedPrefix+string(kind))
		if err != nil {
			return err
		}
		// A report: its worker survived the job, so the count of lost
		// workers starts over.
		var attempts int
		var status storage.JobStatus
		if err := q.txRow(ctx, tx, `UPDATE jobs SET lost_workers = 0 WHERE id = $1 RETURNING status, attempts`,
			jobID).Scan(&status, &attempts); err != nil {
			return err
		}
		if status != storage.JobAssigned {
			return sqldb.Conflict("job %s is %s, not assigned", jobID, status)
		}
		failure := &jobFailure{kind: kind, message: message}
		requeue := kind == storage.FailureAborted || kind == storage.FailureCanceled
		if requeue {
			failure = nil // not a failure of the job
		} else if retryable(kind) && attempts < maxAttempts {
			requeue = true
		}
		if requeue {
			var readyAt *int64
			if failure != nil {
				now := sqldb.NowMillis()
				readyAt = &now
			}
			_, out.Attempts, _, err = q.requeue(ctx, tx, jobID, failure == nil, readyAt, failure)
			out.Requeued = true
		} else {
			out.Failed = true
			err = q.failJob(ctx, tx, jobID, kind, message)
		}
		if err != nil {
			return err
		}
		return q.readOutcome(ctx, tx, jobID, &out)
	})
	return out, nil, err
}

// failJob fails an assigned job for good and cascades the failure.
func (q *Queue) failJob(ctx context.Context, tx *sql.Tx, jobID string, kind storage.FailureKind, message string) error {
	job, err := q.endJob(ctx, tx, jobID, storage.JobFailed)
	if err != nil {
		return err
	}
	now := sqldb.NowMillis()
	if job.kind == storage.JobFlake {
		if _, err := tx.ExecContext(ctx,
			`UPDATE evaluations SET status = 'failed', error = $2, finished_at = $3 WHERE id = $1`,
			job.evalID, message, now); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx,
			`UPDATE builds SET status = 'cancelled', error = 'evaluation failed', finished_at = $2
			 WHERE evaluation_id = $1 AND status IN ('waiting', 'queued')`, job.evalID, now)
		return err
	}
	var drv string
	if err := tx.QueryRowContext(ctx,
		`UPDATE builds SET status = 'failed', failure_kind = $2, error = $3, finished_at = $4
		 WHERE id = $1 RETURNING drv_path`, job.buildID, string(kind), message, now).Scan(&drv); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx,
		`WITH RECURSIVE dependents (drv_path) AS (
		   SELECT drv_path FROM build_edges WHERE evaluation_id = $1 AND dependency_drv_path = $2
		   UNION
		   SELECT e.drv_path FROM build_edges e JOIN dependents d ON e.dependency_drv_path = d.drv_path
		   WHERE e.evaluation_id = $1
		 )
		 UPDATE builds SET status = 'dependency_failed', error = $3, finished_at = $4
		 WHERE evaluation_id = $1 AND status IN ('waiting', 'queued')
		   AND drv_path IN (SELECT drv_path FROM dependents)`,
		job.evalID, drv, dependencyFailedError+drv, now); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx,
		`UPDATE jobs SET status = 'cancelled' WHERE evaluation_id = $1 AND status = 'pending'
		 AND build_id IN (SELECT id FROM builds WHERE evaluation_id = $1 AND status = 'dependency_failed')`,
		job.evalID); err != nil {
		return err
	}
	return q.finishEvaluationIfDone(ctx, tx, job.evalID)
}

// readOutcome fills the statuses a FailOutcome reports.
func (q *Queue) readOutcome(ctx context.Context, tx *sql.Tx, jobID string, out *storage.FailOutcome) error {
	var build sql.NullString
	err := tx.QueryRowContext(ctx,
		`SELECT j.attempts, e.status, b.status FROM jobs j
		 JOIN evaluations e ON e.id = j.evaluation_id
		 LEFT JOIN builds b ON b.id = j.build_id WHERE j.id = $1`, jobID).
		Scan(&out.Attempts, &out.EvaluationStatus, &build)
	out.BuildStatus = storage.BuildStatus(build.String)
	return err
}

// CancelEvaluation cancels an evaluation: its unfinished jobs and builds
// are cancelled, and its open assignments closed ("cancelled") and
// returned, so the server can send AbortJob for each. Cancelling a
// cancelled evaluation changes nothing; a finished one is ErrConflict.
func (q *Queue) CancelEvaluation(ctx context.Context, evalID string) ([]storage.OpenAssignment, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	var open []storage.OpenAssignment
	err = q.durableJobTx(ctx, func(tx *sql.Tx) error {
		open = nil
		var status storage.EvaluationStatus
		err := tx.QueryRowContext(ctx,
			`SELECT status FROM evaluations WHERE id = $1`+q.engine.forUpdate(), evalID).Scan(&status)
		if errors.Is(err, sql.ErrNoRows) {
			return sqldb.NotFound("evaluation %s", evalID)
		}
		if err != nil {
			return err
		}
		switch status {
		case storage.EvaluationCancelled:
			return nil
		case storage.EvaluationSucceeded, storage.EvaluationFailed:
			return sqldb.Conflict("evaluation %s has %s", evalID, status)
		}
		now := sqldb.NowMillis()
		rows, err := tx.QueryContext(ctx,
			`UPDATE job_assignments SET closed_at = $2, outcome = $3
			 WHERE closed_at IS NULL AND job_id IN (SELECT id FROM jobs WHERE evaluation_id = $1 AND status IN ('pending', 'assigned'))
			 RETURNING `+openAssignmentColumns, evalID, now, OutcomeCancelled)
		open, err = sqldb.Collect(rows, err, scanOpenAssignment)
		if err != nil {
			return err
		}
		for _, q := range []string{
			`UPDATE jobs SET status = 'cancelled' WHERE evaluation_id = $1 AND status IN ('pending', 'assigned')`,
			`UPDATE builds SET status = 'cancelled', finished_at = $2
			 WHERE evaluation_id = $1 AND status IN ('waiting', 'queued', 'building')`,
			`UPDATE evaluations SET status = 'cancelled', finished_at = $2 WHERE id = $1`,
		} {
			args := []any{evalID, now}
			if !strings.Contains(q, "$2") {
				args = args[:1]
			}
			if _, err := tx.ExecContext(ctx, q, args...); err != nil {
				return err
			}
		}
		return nil
	})
	return open, err
}
