package storage

import (
	"database/sql"
	"strings"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// The job queue's records: evaluations, builds, jobs and assignments (see
// migrations/0004_jobs.sql). The queue itself, every state change and
// read of them, is package storage/jobqueue.

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
	// InstanceID is the server instance whose job loop opened it and
	// talks to its worker; "" when none was recorded.
	InstanceID string
}

// FailOutcome is what FailJob did.
type FailOutcome struct {
	Requeued         bool // the job is pending again
	Failed           bool // the job failed for good
	Attempts         int  // attempts that counted, after this failure
	BuildStatus      BuildStatus
	EvaluationStatus EvaluationStatus
}

// jsonText and decodeJSON are sqldb's JSON text columns.
func jsonText(v any) (string, error) { return sqldb.JSONText(v) }

func decodeJSON[T any](text sql.NullString, what string) (T, error) {
	return sqldb.DecodeJSON[T](text, what)
}

// RequiredPath is one output of a build's direct input derivation. Cached
// is set, with the NAR's sizes, when a cache of the job's project holds it.
type RequiredPath struct {
	Path     string
	Cached   bool
	FileSize uint64
	NarSize  uint64
}
