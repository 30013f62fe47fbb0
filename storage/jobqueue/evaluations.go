package jobqueue

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// ---- encoding helpers ----

func stringsJSON(list []string) (string, error) {
	if list == nil {
		list = []string{}
	}
	return sqldb.JSONText(list)
}

func optMillis(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return sqldb.FromMillis(v.Int64)
}

func optUint(v sql.NullInt64) *uint64 {
	if !v.Valid {
		return nil
	}
	u := uint64(v.Int64)
	return &u
}

func uintArg(what string, v *uint64) (any, error) {
	if v == nil {
		return nil, nil
	}
	if *v > math.MaxInt64 {
		return nil, sqldb.Invalid("%s %d is too large", what, *v)
	}
	return int64(*v), nil
}

// ---- evaluations ----

const evaluationColumns = `id, project_id, repository_url, commit_sha, wildcards, status,
	flake_source, error, attempts, created_at, started_at, finished_at, source, pr_number, target_branch, approval`

func scanEvaluation(row interface{ Scan(...any) error }) (storage.Evaluation, error) {
	var e storage.Evaluation
	var wildcards, source, errText sql.NullString
	var created int64
	var started, finished, pr sql.NullInt64
	var target, approval sql.NullString
	err := row.Scan(&e.ID, &e.ProjectID, &e.RepositoryURL, &e.Commit, &wildcards, &e.Status,
		&source, &errText, &e.Attempts, &created, &started, &finished, &e.Source, &pr, &target, &approval)
	if err != nil {
		return storage.Evaluation{}, err
	}
	e.PRNumber, e.TargetBranch = int(pr.Int64), target.String
	if e.Status == storage.EvaluationQueued && approval.String == "waiting" {
		e.Status = storage.EvaluationWaiting
	}
	e.FlakeSource, e.Error = source.String, errText.String
	e.CreatedAt, e.StartedAt, e.FinishedAt = sqldb.FromMillis(created), optMillis(started), optMillis(finished)
	e.Wildcards, err = sqldb.DecodeJSON[[]string](wildcards, "evaluation wildcards")
	return e, err
}

// CreateEvaluation adds a queued evaluation with its pending flake job.
// An unknown project is ErrNotFound.
func (q *Queue) CreateEvaluation(ctx context.Context, in storage.NewEvaluation) (storage.Evaluation, error) {
	projectID, err := sqldb.CanonicalUUID("project ID", in.ProjectID)
	if err != nil {
		return storage.Evaluation{}, err
	}
	if strings.TrimSpace(in.RepositoryURL) == "" {
		return storage.Evaluation{}, sqldb.Invalid("evaluation repository URL is empty")
	}
	if strings.TrimSpace(in.Commit) == "" {
		return storage.Evaluation{}, sqldb.Invalid("evaluation commit is empty")
	}
	wildcards, err := stringsJSON(in.Wildcards)
	if err != nil {
		return storage.Evaluation{}, err
	}
	source := cmp.Or(in.Source, storage.SourceManual)
	if !source.Valid() {
		return storage.Evaluation{}, sqldb.Invalid("unknown evaluation source %q", in.Source)
	}
	if in.PRNumber < 0 || (in.PRNumber > 0) != (source == storage.SourcePR) || (in.AwaitApproval && in.PRNumber == 0) {
		return storage.Evaluation{}, sqldb.Invalid("only a pull request's evaluation has a number and may wait for approval")
	}
	e := storage.Evaluation{
		ID: storage.NewID(), ProjectID: projectID, RepositoryURL: in.RepositoryURL, Commit: in.Commit,
		Wildcards: append([]string{}, in.Wildcards...), Status: storage.EvaluationQueued,
		Source: source, PRNumber: in.PRNumber, TargetBranch: in.TargetBranch,
	}
	var pr, target, approval any
	if in.PRNumber > 0 {
		pr, target = int64(in.PRNumber), in.TargetBranch
	}
	if in.AwaitApproval {
		approval, e.Status = "waiting", storage.EvaluationWaiting
	}
	err = q.durableJobTx(ctx, func(tx *sql.Tx) error {
		// Creation times are strictly increasing per project, so the
		// latest evaluation is well defined.
		var last sql.NullInt64
		if err := tx.QueryRowContext(ctx,
			`SELECT MAX(created_at) FROM evaluations WHERE project_id = $1`, projectID).Scan(&last); err != nil {
			return err
		}
		now := sqldb.NowMillis()
		if last.Valid && last.Int64 >= now {
			now = last.Int64 + 1
		}
		e.CreatedAt = sqldb.FromMillis(now)
		_, err := tx.ExecContext(ctx,
			`INSERT INTO evaluations (id, project_id, repository_url, commit_sha, wildcards, status, attempts, created_at,
				source, pr_number, target_branch, approval)
			 VALUES ($1, $2, $3, $4, $5, 'queued', 0, $6, $7, $8, $9, $10)`,
			e.ID, projectID, e.RepositoryURL, e.Commit, wildcards, now, string(source), pr, target, approval)
		if sqldb.ConstraintOf(err) == sqldb.ForeignKeyViolation {
			return sqldb.NotFound("project %s", projectID)
		}
		if err != nil || in.AwaitApproval {
			return err
		}
		_, err = tx.ExecContext(ctx,
			`INSERT INTO jobs (id, kind, evaluation_id, project_id, status, ready_at, attempts, created_at)
			 VALUES ($1, 'flake', $2, $3, 'pending', $4, 0, $4)`,
			storage.NewID(), e.ID, projectID, now)
		return err
	})
	if err != nil {
		return storage.Evaluation{}, err
	}
	return e, nil
}

// Evaluation returns the evaluation with id.
func (q *Queue) Evaluation(ctx context.Context, id string) (storage.Evaluation, error) {
	id, err := sqldb.CanonicalUUID("evaluation ID", id)
	if err != nil {
		return storage.Evaluation{}, err
	}
	e, err := scanEvaluation(q.sql.QueryRowContext(ctx,
		`SELECT `+evaluationColumns+` FROM evaluations WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return storage.Evaluation{}, sqldb.NotFound("evaluation %s", id)
	}
	return e, err
}

// ListEvaluations returns a project's evaluations ("" = every project's),
// newest first, at most limit of them (limit <= 0: all).
func (q *Queue) ListEvaluations(ctx context.Context, projectID string, limit int) ([]storage.Evaluation, error) {
	query := `SELECT ` + evaluationColumns + ` FROM evaluations`
	var args []any
	if projectID != "" {
		id, err := sqldb.CanonicalUUID("project ID", projectID)
		if err != nil {
			return nil, err
		}
		query += ` WHERE project_id = $1`
		args = append(args, id)
	}
	query += ` ORDER BY created_at DESC, id DESC`
	if limit > 0 {
		query += fmt.Sprintf(` LIMIT %d`, limit)
	}
	rows, err := q.sql.QueryContext(ctx, query, args...)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (storage.Evaluation, error) { return scanEvaluation(r) })
}

// LatestEvaluation returns the project's newest evaluation, ErrNotFound
// when it has none.
func (q *Queue) LatestEvaluation(ctx context.Context, projectID string) (storage.Evaluation, error) {
	id, err := sqldb.CanonicalUUID("project ID", projectID)
	if err != nil {
		return storage.Evaluation{}, err
	}
	e, err := scanEvaluation(q.sql.QueryRowContext(ctx,
		`SELECT `+evaluationColumns+` FROM evaluations WHERE project_id = $1
		 ORDER BY created_at DESC, id DESC LIMIT 1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return storage.Evaluation{}, sqldb.NotFound("evaluation of project %s", id)
	}
	return e, err
}

// ---- builds ----

const buildColumns = `id, evaluation_id, drv_path, attr, architecture, required_features, outputs,
	timeout_secs, max_silent_secs, is_fixed_output, prefer_local_build, status, failure_kind, error,
	attempts, worker_id, output_info, created_at, started_at, finished_at`

func scanBuild(row interface{ Scan(...any) error }) (storage.Build, error) {
	var b storage.Build
	var features, outputs, kind, errText, worker, info sql.NullString
	var timeout, silent, started, finished sql.NullInt64
	var created int64
	err := row.Scan(&b.ID, &b.EvaluationID, &b.DrvPath, &b.Attr, &b.Architecture, &features, &outputs,
		&timeout, &silent, &b.IsFixedOutput, &b.PreferLocalBuild, &b.Status, &kind, &errText,
		&b.Attempts, &worker, &info, &created, &started, &finished)
	if err != nil {
		return storage.Build{}, err
	}
	b.TimeoutSecs, b.MaxSilentSecs = optUint(timeout), optUint(silent)
	b.FailureKind, b.Error, b.WorkerID = storage.FailureKind(kind.String), errText.String, worker.String
	b.CreatedAt, b.StartedAt, b.FinishedAt = sqldb.FromMillis(created), optMillis(started), optMillis(finished)
	if b.RequiredFeatures, err = sqldb.DecodeJSON[[]string](features, "build required features"); err != nil {
		return storage.Build{}, err
	}
	if b.Outputs, err = sqldb.DecodeJSON[[]storage.BuildOutputPath](outputs, "build outputs"); err != nil {
		return storage.Build{}, err
	}
	b.OutputInfo, err = sqldb.DecodeJSON[[]storage.BuildOutputInfo](info, "build output info")
	return b, err
}

// Build returns the build with id.
func (q *Queue) Build(ctx context.Context, id string) (storage.Build, error) {
	id, err := sqldb.CanonicalUUID("build ID", id)
	if err != nil {
		return storage.Build{}, err
	}
	b, err := scanBuild(q.sql.QueryRowContext(ctx, `SELECT `+buildColumns+` FROM builds WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return storage.Build{}, sqldb.NotFound("build %s", id)
	}
	return b, err
}

// EvaluationBuilds returns an evaluation's builds: entry points (by
// attribute) first, then dependencies by drv path. An unknown evaluation
// is ErrNotFound.
func (q *Queue) EvaluationBuilds(ctx context.Context, evalID string) ([]storage.Build, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	rows, err := q.sql.QueryContext(ctx, `SELECT `+buildColumns+` FROM builds WHERE evaluation_id = $1
		ORDER BY CASE WHEN attr = '' THEN 1 ELSE 0 END, attr, drv_path`, evalID)
	builds, err := sqldb.Collect(rows, err, func(r *sql.Rows) (storage.Build, error) { return scanBuild(r) })
	if err == nil && len(builds) == 0 {
		if ok, err := sqldb.Exists(ctx, q.sql, `SELECT 1 FROM evaluations WHERE id = $1`, evalID); err != nil {
			return nil, err
		} else if !ok {
			return nil, sqldb.NotFound("evaluation %s", evalID)
		}
	}
	return builds, err
}

// EvaluationBuildsPastWaiting is EvaluationBuilds without the waiting
// builds, in the same order: what a progress display prints while the
// evaluation still discovers derivations (it keeps adding waiting builds,
// and builds streamed meanwhile are a few of them).
func (q *Queue) EvaluationBuildsPastWaiting(ctx context.Context, evalID string) ([]storage.Build, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	rows, err := q.sql.QueryContext(ctx, `SELECT `+buildColumns+` FROM builds WHERE evaluation_id = $1 AND status <> 'waiting'
		ORDER BY CASE WHEN attr = '' THEN 1 ELSE 0 END, attr, drv_path`, evalID)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (storage.Build, error) { return scanBuild(r) })
}

// ---- pending jobs ----

const pendingJobQuery = `SELECT j.id, j.kind, j.evaluation_id, j.project_id, j.ready_at, j.attempts,
	e.repository_url, e.commit_sha, e.wildcards, e.flake_source,
	b.id, b.drv_path, b.attr, b.architecture, b.required_features, b.outputs,
	b.timeout_secs, b.max_silent_secs, b.is_fixed_output, b.prefer_local_build
	FROM jobs j
	JOIN evaluations e ON e.id = j.evaluation_id
	LEFT JOIN builds b ON b.id = j.build_id
	WHERE j.status = 'pending'`

// pendingJobsByIDSQL is pendingJobQuery for given IDs, its %[1]s the ID
// list, run on the keyed pool. Its pending condition is written so the
// partial index jobs_pending cannot serve it: a plan cached while the
// table was small (pgx prepares every statement) otherwise walks that
// index, which holds an entry for every job that was ever pending until a
// vacuum, on each call (up to 96 buffers per assignment at 100,000 builds;
// docs/PERFORMANCE.md, "Dispatch at scale"); on the main pool the cached
// plan would scan jobs instead.
var pendingJobsByIDSQL = strings.Replace(pendingJobQuery, `WHERE j.status = 'pending'`,
	`WHERE CASE WHEN j.status = 'pending' THEN true ELSE false END`, 1) + ` AND j.id %[1]s`

func scanPendingJob(r *sql.Rows) (storage.PendingJob, error) {
	var p storage.PendingJob
	var ready int64
	var wildcards, source, buildID, drv, attr, arch, features, outputs sql.NullString
	var timeout, silent sql.NullInt64
	var fixed, local sql.NullBool
	err := r.Scan(&p.JobID, &p.Kind, &p.EvaluationID, &p.ProjectID, &ready, &p.Attempts,
		&p.RepositoryURL, &p.Commit, &wildcards, &source,
		&buildID, &drv, &attr, &arch, &features, &outputs, &timeout, &silent, &fixed, &local)
	if err != nil {
		return storage.PendingJob{}, err
	}
	p.ReadyAt = sqldb.FromMillis(ready)
	p.FlakeSource = source.String
	if p.Kind == storage.JobFlake {
		p.Wildcards, err = sqldb.DecodeJSON[[]string](wildcards, "evaluation wildcards")
		return p, err
	}
	p.BuildID, p.DrvPath, p.Attr, p.Architecture = buildID.String, drv.String, attr.String, arch.String
	p.TimeoutSecs, p.MaxSilentSecs = optUint(timeout), optUint(silent)
	p.IsFixedOutput, p.PreferLocalBuild = fixed.Bool, local.Bool
	if p.RequiredFeatures, err = sqldb.DecodeJSON[[]string](features, "build required features"); err != nil {
		return storage.PendingJob{}, err
	}
	p.Outputs, err = sqldb.DecodeJSON[[]storage.BuildOutputPath](outputs, "build outputs")
	return p, err
}

// PendingJobs returns every pending job, oldest ready first (ties by id).
func (q *Queue) PendingJobs(ctx context.Context) ([]storage.PendingJob, error) {
	rows, err := q.sql.QueryContext(ctx, pendingJobQuery+` ORDER BY j.ready_at, j.id`)
	return sqldb.Collect(rows, err, scanPendingJob)
}

// PendingJobIDs returns the IDs of every pending job, in no order: what
// a resync of a copy of the queue needs to find jobs it lacks or holds
// too many of, at a fraction of PendingJobs' cost.
func (q *Queue) PendingJobIDs(ctx context.Context) ([]string, error) {
	rows, err := q.sql.QueryContext(ctx, `SELECT id FROM jobs WHERE status = 'pending'`)
	return sqldb.Collect(rows, err, scanString)
}

// PendingJobsByID returns those of the jobs ids that are pending (e.g. the
// ones CompleteBuild made ready), in the order of PendingJobs.
func (q *Queue) PendingJobsByID(ctx context.Context, ids []string) ([]storage.PendingJob, error) {
	canonical := make([]string, len(ids))
	for i, id := range ids {
		id, err := sqldb.CanonicalUUID("job ID", id)
		if err != nil {
			return nil, err
		}
		canonical[i] = id
	}
	jobs, err := queryByIDsOn(ctx, q, q.keyed, pendingJobsByIDSQL, canonical, scanPendingJob)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(jobs, func(a, b storage.PendingJob) int {
		if c := a.ReadyAt.Compare(b.ReadyAt); c != 0 {
			return c
		}
		return strings.Compare(a.JobID, b.JobID)
	})
	return jobs, nil
}

// OpenAssignments returns every open assignment, oldest first.
func (q *Queue) OpenAssignments(ctx context.Context) ([]storage.OpenAssignment, error) {
	rows, err := q.sql.QueryContext(ctx,
		`SELECT `+openAssignmentColumns+` FROM job_assignments WHERE closed_at IS NULL ORDER BY opened_at, id`)
	return sqldb.Collect(rows, err, scanOpenAssignment)
}

// openAssignmentColumns are the columns scanOpenAssignment reads.
const openAssignmentColumns = `id, job_id, worker_id, opened_at, instance_id`

func scanOpenAssignment(r *sql.Rows) (storage.OpenAssignment, error) {
	var a storage.OpenAssignment
	var opened int64
	var instance sql.NullString
	err := r.Scan(&a.AssignmentID, &a.JobID, &a.WorkerID, &opened, &instance)
	a.OpenedAt, a.InstanceID = sqldb.FromMillis(opened), instance.String
	return a, err
}
