package storage

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// The durable job queue (see migrations/0004_jobs.sql).
//
// An evaluation of a project's commit owns one flake job. Its worker
// reports the derivations it discovered (AddDiscoveredDerivations): each
// becomes a waiting build. When the flake job completes, every build whose
// dependencies are built becomes queued with a pending build job; each
// completed build readies its dependents the same way. Jobs are claimed by
// opening an assignment (at most one open per job) and end through
// CompleteFlakeJob, CompleteBuild, FailJob, ReleaseAssignment or
// CancelEvaluation. Every state change is one short transaction; the
// scheduler keeps its hot state in memory and reads the queue back with
// PendingJobs after a restart (RecoverInterruptedWork first).

// EvaluationStatus is the state of an evaluation.
type EvaluationStatus string

const (
	EvaluationQueued     EvaluationStatus = "queued"
	EvaluationFetching   EvaluationStatus = "fetching"
	EvaluationEvaluating EvaluationStatus = "evaluating"
	EvaluationBuilding   EvaluationStatus = "building"
	EvaluationSucceeded  EvaluationStatus = "succeeded"
	EvaluationFailed     EvaluationStatus = "failed"
	EvaluationCancelled  EvaluationStatus = "cancelled"
	// EvaluationWaiting is a queued evaluation of a pull request that
	// waits for an approval: it has no flake job yet (ApproveEvaluation).
	// The database keeps it as queued with approval 'waiting'.
	EvaluationWaiting EvaluationStatus = "waiting_for_approval"
)

// EvaluationSource is what started an evaluation.
type EvaluationSource string

const (
	SourceManual EvaluationSource = "manual" // the admin API (gradient eval start)
	SourcePoll   EvaluationSource = "poll"   // the branch poller
	SourcePush   EvaluationSource = "push"   // a forge's push webhook
	SourcePR     EvaluationSource = "pr"     // a forge's pull request webhook
)

// Valid reports a known source.
func (s EvaluationSource) Valid() bool {
	return s == SourceManual || s == SourcePoll || s == SourcePush || s == SourcePR
}

// Terminal reports whether the evaluation has ended.
func (s EvaluationStatus) Terminal() bool {
	return s == EvaluationSucceeded || s == EvaluationFailed || s == EvaluationCancelled
}

// BuildStatus is the state of a build.
type BuildStatus string

const (
	BuildWaiting          BuildStatus = "waiting" // inputs not built yet
	BuildQueued           BuildStatus = "queued"  // has a pending job
	BuildBuilding         BuildStatus = "building"
	BuildSucceeded        BuildStatus = "succeeded"
	BuildFailed           BuildStatus = "failed"
	BuildDependencyFailed BuildStatus = "dependency_failed"
	BuildCancelled        BuildStatus = "cancelled"
)

// Terminal reports whether the build has ended.
func (s BuildStatus) Terminal() bool {
	switch s {
	case BuildSucceeded, BuildFailed, BuildDependencyFailed, BuildCancelled:
		return true
	}
	return false
}

// JobKind tells a flake (fetch and evaluate) job from a build job.
type JobKind string

const (
	JobFlake JobKind = "flake"
	JobBuild JobKind = "build"
)

// JobStatus is the state of a job.
type JobStatus string

const (
	JobPending   JobStatus = "pending"
	JobAssigned  JobStatus = "assigned"
	JobDone      JobStatus = "done"
	JobFailed    JobStatus = "failed"
	JobCancelled JobStatus = "cancelled"
)

// FailureKind is the kind of a JobFailed report; the values are the wire
// protocol's BuildFailureKind names.
type FailureKind string

const (
	FailureTransient             FailureKind = "Transient"
	FailurePermanent             FailureKind = "Permanent"
	FailureTimeout               FailureKind = "Timeout"
	FailureSubstituteUnavailable FailureKind = "SubstituteUnavailable"
	FailureInputsUnavailable     FailureKind = "InputsUnavailable"
	FailureCorruptEvalCache      FailureKind = "CorruptEvalCache"
	FailureAborted               FailureKind = "Aborted"
	FailureCanceled              FailureKind = "Canceled"
)

// Valid reports whether k is one of the known kinds.
func (k FailureKind) Valid() bool {
	switch k {
	case FailureTransient, FailurePermanent, FailureTimeout, FailureSubstituteUnavailable,
		FailureInputsUnavailable, FailureCorruptEvalCache, FailureAborted, FailureCanceled:
		return true
	}
	return false
}

// Evaluation is one run of a project's flake at a commit. Zero times are
// unset.
type Evaluation struct {
	ID            string
	ProjectID     string
	RepositoryURL string
	Commit        string
	Wildcards     []string
	Status        EvaluationStatus
	FlakeSource   string // fetched source store path, "" until reported
	Error         string // why it failed (or the last retried failure)
	Attempts      int    // flake job runs that counted
	Source        EvaluationSource
	PRNumber      int    // the pull request evaluated, 0 for a branch
	TargetBranch  string // the branch the pull request targets
	CreatedAt     time.Time
	StartedAt     time.Time
	FinishedAt    time.Time
}

// NewEvaluation is the input of CreateEvaluation.
type NewEvaluation struct {
	ProjectID     string
	RepositoryURL string
	Commit        string
	Wildcards     []string
	Source        EvaluationSource // "" is SourceManual
	PRNumber      int              // a pull request's number, 0 for a branch
	TargetBranch  string           // the branch the pull request targets
	// AwaitApproval queues no flake job until ApproveEvaluation.
	AwaitApproval bool
}

// BuildOutputPath is a derivation output as the derivation names it.
type BuildOutputPath struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// BuildOutputInfo is an output a worker reported after building it.
// NarSize 0 and NarHash "" mean unknown.
type BuildOutputInfo struct {
	Name      string `json:"name"`
	StorePath string `json:"store_path"`
	NarSize   uint64 `json:"nar_size,omitempty"`
	NarHash   string `json:"nar_hash,omitempty"`
}

// DiscoveredBuild is one derivation an evaluation reported.
type DiscoveredBuild struct {
	Attr             string // entry-point attribute path, "" for a dependency
	DrvPath          string
	Outputs          []BuildOutputPath
	Dependencies     []string // input .drv paths
	Architecture     string
	RequiredFeatures []string
	TimeoutSecs      *uint64
	MaxSilentSecs    *uint64
	IsFixedOutput    bool
	PreferLocalBuild bool
}

// Build is a derivation of an evaluation and its build state. Zero times
// are unset.
type Build struct {
	ID               string
	EvaluationID     string
	DrvPath          string
	Attr             string
	Architecture     string
	RequiredFeatures []string
	Outputs          []BuildOutputPath
	TimeoutSecs      *uint64
	MaxSilentSecs    *uint64
	IsFixedOutput    bool
	PreferLocalBuild bool
	Status           BuildStatus
	FailureKind      FailureKind // of the last failure, "" if none
	Error            string
	Attempts         int    // runs that counted toward the attempt limit
	WorkerID         string // of the latest run
	OutputInfo       []BuildOutputInfo
	CreatedAt        time.Time
	StartedAt        time.Time
	FinishedAt       time.Time
}

// StatusText is the status for people: "timed out" for a build that
// failed with a Timeout, otherwise the status with spaces.
func (b Build) StatusText() string {
	if b.Status == BuildFailed && b.FailureKind == FailureTimeout {
		return "timed out"
	}
	if b.Cached() {
		return "cached"
	}
	return strings.ReplaceAll(string(b.Status), "_", " ")
}

// Cached reports a build that succeeded without running: its outputs
// were in the project's caches already (MarkBuildsCached).
func (b Build) Cached() bool { return b.Status == BuildSucceeded && b.WorkerID == "" }

// Duration is how long the latest run took (or has taken so far, when
// still building); 0 before the build started.
func (b Build) Duration() time.Duration {
	return span(b.StartedAt, b.FinishedAt)
}

// Duration is how long the evaluation took (or has taken so far).
func (e Evaluation) Duration() time.Duration {
	return span(e.StartedAt, e.FinishedAt)
}

func span(start, end time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	if end.IsZero() {
		return time.Since(start)
	}
	return end.Sub(start)
}

// PendingJob is a job waiting for a worker, with what dispatch needs.
type PendingJob struct {
	JobID        string
	Kind         JobKind
	EvaluationID string
	ProjectID    string
	ReadyAt      time.Time
	Attempts     int // attempts that counted so far (for backoff)

	// Flake jobs.
	RepositoryURL string
	Commit        string
	Wildcards     []string
	FlakeSource   string

	// Build jobs.
	BuildID          string
	DrvPath          string
	Attr             string
	Architecture     string
	RequiredFeatures []string
	Outputs          []BuildOutputPath
	TimeoutSecs      *uint64
	MaxSilentSecs    *uint64
	IsFixedOutput    bool
	PreferLocalBuild bool
	// RequiredPaths are the outputs of the derivation's direct input
	// derivations, by path: not read with the job (nil) but by
	// FillRequiredPaths, since only offers need them, an idle worker's
	// assignment does not.
	RequiredPaths []RequiredPath
}

// OpenAssignment is a job currently handed to a worker.
type OpenAssignment struct {
	AssignmentID string
	JobID        string
	WorkerID     string
	OpenedAt     time.Time
}

// FailOutcome is what FailJob did.
type FailOutcome struct {
	Requeued         bool // the job is pending again
	Failed           bool // the job failed for good
	Attempts         int  // attempts that counted, after this failure
	BuildStatus      BuildStatus
	EvaluationStatus EvaluationStatus
}

// ---- encoding helpers ----

func jsonText(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

func stringsJSON(list []string) (string, error) {
	if list == nil {
		list = []string{}
	}
	return jsonText(list)
}

func decodeJSON[T any](text sql.NullString, what string) (T, error) {
	var v T
	if !text.Valid || text.String == "" {
		return v, nil
	}
	if err := json.Unmarshal([]byte(text.String), &v); err != nil {
		return v, fmt.Errorf("decode %s: %w", what, err)
	}
	return v, nil
}

func optMillis(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMillis(v.Int64)
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
		return nil, invalid("%s %d is too large", what, *v)
	}
	return int64(*v), nil
}

// ---- evaluations ----

const evaluationColumns = `id, project_id, repository_url, commit_sha, wildcards, status,
	flake_source, error, attempts, created_at, started_at, finished_at, source, pr_number, target_branch, approval`

func scanEvaluation(row interface{ Scan(...any) error }) (Evaluation, error) {
	var e Evaluation
	var wildcards, source, errText sql.NullString
	var created int64
	var started, finished, pr sql.NullInt64
	var target, approval sql.NullString
	err := row.Scan(&e.ID, &e.ProjectID, &e.RepositoryURL, &e.Commit, &wildcards, &e.Status,
		&source, &errText, &e.Attempts, &created, &started, &finished, &e.Source, &pr, &target, &approval)
	if err != nil {
		return Evaluation{}, err
	}
	e.PRNumber, e.TargetBranch = int(pr.Int64), target.String
	if e.Status == EvaluationQueued && approval.String == "waiting" {
		e.Status = EvaluationWaiting
	}
	e.FlakeSource, e.Error = source.String, errText.String
	e.CreatedAt, e.StartedAt, e.FinishedAt = fromMillis(created), optMillis(started), optMillis(finished)
	e.Wildcards, err = decodeJSON[[]string](wildcards, "evaluation wildcards")
	return e, err
}

// CreateEvaluation adds a queued evaluation with its pending flake job.
// An unknown project is ErrNotFound.
func (db *DB) CreateEvaluation(ctx context.Context, in NewEvaluation) (Evaluation, error) {
	projectID, err := canonicalUUID("project ID", in.ProjectID)
	if err != nil {
		return Evaluation{}, err
	}
	if strings.TrimSpace(in.RepositoryURL) == "" {
		return Evaluation{}, invalid("evaluation repository URL is empty")
	}
	if strings.TrimSpace(in.Commit) == "" {
		return Evaluation{}, invalid("evaluation commit is empty")
	}
	wildcards, err := stringsJSON(in.Wildcards)
	if err != nil {
		return Evaluation{}, err
	}
	source := cmp.Or(in.Source, SourceManual)
	if !source.Valid() {
		return Evaluation{}, invalid("unknown evaluation source %q", in.Source)
	}
	if in.PRNumber < 0 || (in.PRNumber > 0) != (source == SourcePR) || (in.AwaitApproval && in.PRNumber == 0) {
		return Evaluation{}, invalid("only a pull request's evaluation has a number and may wait for approval")
	}
	e := Evaluation{
		ID: NewID(), ProjectID: projectID, RepositoryURL: in.RepositoryURL, Commit: in.Commit,
		Wildcards: append([]string{}, in.Wildcards...), Status: EvaluationQueued,
		Source: source, PRNumber: in.PRNumber, TargetBranch: in.TargetBranch,
	}
	var pr, target, approval any
	if in.PRNumber > 0 {
		pr, target = int64(in.PRNumber), in.TargetBranch
	}
	if in.AwaitApproval {
		approval, e.Status = "waiting", EvaluationWaiting
	}
	err = db.durableJobTx(ctx, func(tx *sql.Tx) error {
		// Creation times are strictly increasing per project, so the
		// latest evaluation is well defined.
		var last sql.NullInt64
		if err := tx.QueryRowContext(ctx,
			`SELECT MAX(created_at) FROM evaluations WHERE project_id = $1`, projectID).Scan(&last); err != nil {
			return err
		}
		now := nowMillis()
		if last.Valid && last.Int64 >= now {
			now = last.Int64 + 1
		}
		e.CreatedAt = fromMillis(now)
		_, err := tx.ExecContext(ctx,
			`INSERT INTO evaluations (id, project_id, repository_url, commit_sha, wildcards, status, attempts, created_at,
				source, pr_number, target_branch, approval)
			 VALUES ($1, $2, $3, $4, $5, 'queued', 0, $6, $7, $8, $9, $10)`,
			e.ID, projectID, e.RepositoryURL, e.Commit, wildcards, now, string(source), pr, target, approval)
		if constraintOf(err) == foreignKeyViolation {
			return notFound("project %s", projectID)
		}
		if err != nil || in.AwaitApproval {
			return err
		}
		_, err = tx.ExecContext(ctx,
			`INSERT INTO jobs (id, kind, evaluation_id, project_id, status, ready_at, attempts, created_at)
			 VALUES ($1, 'flake', $2, $3, 'pending', $4, 0, $4)`,
			NewID(), e.ID, projectID, now)
		return err
	})
	if err != nil {
		return Evaluation{}, err
	}
	return e, nil
}

// Evaluation returns the evaluation with id.
func (db *DB) Evaluation(ctx context.Context, id string) (Evaluation, error) {
	id, err := canonicalUUID("evaluation ID", id)
	if err != nil {
		return Evaluation{}, err
	}
	e, err := scanEvaluation(db.sql.QueryRowContext(ctx,
		`SELECT `+evaluationColumns+` FROM evaluations WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Evaluation{}, notFound("evaluation %s", id)
	}
	return e, err
}

// ListEvaluations returns a project's evaluations ("" = every project's),
// newest first, at most limit of them (limit <= 0: all).
func (db *DB) ListEvaluations(ctx context.Context, projectID string, limit int) ([]Evaluation, error) {
	query := `SELECT ` + evaluationColumns + ` FROM evaluations`
	var args []any
	if projectID != "" {
		id, err := canonicalUUID("project ID", projectID)
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
	rows, err := db.sql.QueryContext(ctx, query, args...)
	return collect(rows, err, func(r *sql.Rows) (Evaluation, error) { return scanEvaluation(r) })
}

// LatestEvaluation returns the project's newest evaluation, ErrNotFound
// when it has none.
func (db *DB) LatestEvaluation(ctx context.Context, projectID string) (Evaluation, error) {
	id, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return Evaluation{}, err
	}
	e, err := scanEvaluation(db.sql.QueryRowContext(ctx,
		`SELECT `+evaluationColumns+` FROM evaluations WHERE project_id = $1
		 ORDER BY created_at DESC, id DESC LIMIT 1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Evaluation{}, notFound("evaluation of project %s", id)
	}
	return e, err
}

// ---- builds ----

const buildColumns = `id, evaluation_id, drv_path, attr, architecture, required_features, outputs,
	timeout_secs, max_silent_secs, is_fixed_output, prefer_local_build, status, failure_kind, error,
	attempts, worker_id, output_info, created_at, started_at, finished_at`

func scanBuild(row interface{ Scan(...any) error }) (Build, error) {
	var b Build
	var features, outputs, kind, errText, worker, info sql.NullString
	var timeout, silent, started, finished sql.NullInt64
	var created int64
	err := row.Scan(&b.ID, &b.EvaluationID, &b.DrvPath, &b.Attr, &b.Architecture, &features, &outputs,
		&timeout, &silent, &b.IsFixedOutput, &b.PreferLocalBuild, &b.Status, &kind, &errText,
		&b.Attempts, &worker, &info, &created, &started, &finished)
	if err != nil {
		return Build{}, err
	}
	b.TimeoutSecs, b.MaxSilentSecs = optUint(timeout), optUint(silent)
	b.FailureKind, b.Error, b.WorkerID = FailureKind(kind.String), errText.String, worker.String
	b.CreatedAt, b.StartedAt, b.FinishedAt = fromMillis(created), optMillis(started), optMillis(finished)
	if b.RequiredFeatures, err = decodeJSON[[]string](features, "build required features"); err != nil {
		return Build{}, err
	}
	if b.Outputs, err = decodeJSON[[]BuildOutputPath](outputs, "build outputs"); err != nil {
		return Build{}, err
	}
	b.OutputInfo, err = decodeJSON[[]BuildOutputInfo](info, "build output info")
	return b, err
}

// Build returns the build with id.
func (db *DB) Build(ctx context.Context, id string) (Build, error) {
	id, err := canonicalUUID("build ID", id)
	if err != nil {
		return Build{}, err
	}
	b, err := scanBuild(db.sql.QueryRowContext(ctx, `SELECT `+buildColumns+` FROM builds WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Build{}, notFound("build %s", id)
	}
	return b, err
}

// EvaluationBuilds returns an evaluation's builds: entry points (by
// attribute) first, then dependencies by drv path. An unknown evaluation
// is ErrNotFound.
func (db *DB) EvaluationBuilds(ctx context.Context, evalID string) ([]Build, error) {
	evalID, err := canonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	rows, err := db.sql.QueryContext(ctx, `SELECT `+buildColumns+` FROM builds WHERE evaluation_id = $1
		ORDER BY CASE WHEN attr = '' THEN 1 ELSE 0 END, attr, drv_path`, evalID)
	builds, err := collect(rows, err, func(r *sql.Rows) (Build, error) { return scanBuild(r) })
	if err == nil && len(builds) == 0 {
		if ok, err := exists(ctx, db.sql, `SELECT 1 FROM evaluations WHERE id = $1`, evalID); err != nil {
			return nil, err
		} else if !ok {
			return nil, notFound("evaluation %s", evalID)
		}
	}
	return builds, err
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

func scanPendingJob(r *sql.Rows) (PendingJob, error) {
	var p PendingJob
	var ready int64
	var wildcards, source, buildID, drv, attr, arch, features, outputs sql.NullString
	var timeout, silent sql.NullInt64
	var fixed, local sql.NullBool
	err := r.Scan(&p.JobID, &p.Kind, &p.EvaluationID, &p.ProjectID, &ready, &p.Attempts,
		&p.RepositoryURL, &p.Commit, &wildcards, &source,
		&buildID, &drv, &attr, &arch, &features, &outputs, &timeout, &silent, &fixed, &local)
	if err != nil {
		return PendingJob{}, err
	}
	p.ReadyAt = fromMillis(ready)
	p.FlakeSource = source.String
	if p.Kind == JobFlake {
		p.Wildcards, err = decodeJSON[[]string](wildcards, "evaluation wildcards")
		return p, err
	}
	p.BuildID, p.DrvPath, p.Attr, p.Architecture = buildID.String, drv.String, attr.String, arch.String
	p.TimeoutSecs, p.MaxSilentSecs = optUint(timeout), optUint(silent)
	p.IsFixedOutput, p.PreferLocalBuild = fixed.Bool, local.Bool
	if p.RequiredFeatures, err = decodeJSON[[]string](features, "build required features"); err != nil {
		return PendingJob{}, err
	}
	p.Outputs, err = decodeJSON[[]BuildOutputPath](outputs, "build outputs")
	return p, err
}

// PendingJobs returns every pending job, oldest ready first (ties by id).
func (db *DB) PendingJobs(ctx context.Context) ([]PendingJob, error) {
	rows, err := db.sql.QueryContext(ctx, pendingJobQuery+` ORDER BY j.ready_at, j.id`)
	return collect(rows, err, scanPendingJob)
}

// PendingJobIDs returns the IDs of every pending job, in no order: what
// a resync of a copy of the queue needs to find jobs it lacks or holds
// too many of, at a fraction of PendingJobs' cost.
func (db *DB) PendingJobIDs(ctx context.Context) ([]string, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT id FROM jobs WHERE status = 'pending'`)
	return collect(rows, err, scanString)
}

// PendingJobsByID returns those of the jobs ids that are pending (e.g. the
// ones CompleteBuild made ready), in the order of PendingJobs.
func (db *DB) PendingJobsByID(ctx context.Context, ids []string) ([]PendingJob, error) {
	canonical := make([]string, len(ids))
	for i, id := range ids {
		id, err := canonicalUUID("job ID", id)
		if err != nil {
			return nil, err
		}
		canonical[i] = id
	}
	jobs, err := queryByIDsOn(ctx, db, db.keyed, pendingJobsByIDSQL, canonical, scanPendingJob)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(jobs, func(a, b PendingJob) int {
		if c := a.ReadyAt.Compare(b.ReadyAt); c != 0 {
			return c
		}
		return strings.Compare(a.JobID, b.JobID)
	})
	return jobs, nil
}

// OpenAssignments returns every open assignment, oldest first.
func (db *DB) OpenAssignments(ctx context.Context) ([]OpenAssignment, error) {
	rows, err := db.sql.QueryContext(ctx,
		`SELECT id, job_id, worker_id, opened_at FROM job_assignments WHERE closed_at IS NULL ORDER BY opened_at, id`)
	return collect(rows, err, func(r *sql.Rows) (OpenAssignment, error) {
		var a OpenAssignment
		var opened int64
		err := r.Scan(&a.AssignmentID, &a.JobID, &a.WorkerID, &opened)
		a.OpenedAt = fromMillis(opened)
		return a, err
	})
}
