package worker

import (
	"context"
	"errors"
	"io"

	"gradient.dev/gradient/wire"
)

// Assignment is one job handed to the worker by AssignJob.
type Assignment struct {
	JobID   string
	Kind    wire.JobKind
	Job     wire.Job // *wire.FlakeJob or *wire.BuildJob
	Cluster *wire.ClusterMembership
	// SSHKey is the project's deploy key, when the server sent one
	// (Credential SshKey, just before a fetch job's AssignJob).
	SSHKey []byte
}

// Reporter sends a job's progress on its session. Every report carries the
// job's current assignment ID (it changes when the server re-sends the
// job). Sends fail once the session is gone.
type Reporter interface {
	Update(u wire.JobUpdateKind) error
	Log(taskIndex uint32, data []byte) error
	BuildProgress(p wire.BuildProgress) error
	EvalProgress(p wire.EvalProgressState) error
	// Send is for the job's other messages (EvalMessage, Credential
	// requests).
	Send(m wire.ClientMessage) error
	// Cache is the session's binary-cache client (queries, pulls,
	// uploads), valid for the job's lifetime.
	Cache() Cache
}

// Cache is the server's binary cache as a job uses it; *CacheClient
// implements it over the session.
type Cache interface {
	Query(ctx context.Context, jobID string, paths []string, mode wire.QueryMode) ([]wire.CachedPath, error)
	// OpenNar streams path's compressed NAR object from the cache.
	OpenNar(ctx context.Context, jobID, path string) (io.ReadCloser, error)
	Upload(ctx context.Context, jobID, storePath string, nar io.Reader, meta UploadMeta) error
	KnownDerivations(ctx context.Context, jobID string, drvPaths []string) ([]string, error)
}

// Executor runs jobs; the loop turns its result into JobCompleted or
// JobFailed. Run must return soon after ctx is cancelled (abort, stop,
// lost session). A failure is classified by wrapping it in a *JobError;
// any other error is Permanent.
type Executor interface {
	Run(ctx context.Context, job Assignment, report Reporter) error
}

// JobError is a job failure of a known kind (docs/protocol/jobs.md §10).
type JobError struct {
	Kind         wire.BuildFailureKind
	MissingPaths []string // InputsUnavailable only
	Err          error
}

func (e *JobError) Error() string { return e.Err.Error() }
func (e *JobError) Unwrap() error { return e.Err }

// Fail classifies err as kind.
func Fail(kind wire.BuildFailureKind, err error) error {
	return &JobError{Kind: kind, Err: err}
}

// failureKind is how a failed job is reported: the cancel cause wins
// (an aborted or stopped job's executor error is a consequence of it).
func failureKind(cause, err error) (wire.BuildFailureKind, []string) {
	switch {
	case errors.Is(cause, errAbortedByServer):
		return wire.FailureAborted, nil
	case errors.Is(cause, errWorkerStopping):
		return wire.FailureCanceled, nil
	}
	var je *JobError
	if errors.As(err, &je) {
		return je.Kind, je.MissingPaths
	}
	return wire.FailurePermanent, nil
}

// Why a job's context was cancelled.
var (
	errAbortedByServer = errors.New("aborted by server")
	errWorkerStopping  = errors.New("worker stopping")
	errSessionLost     = errors.New("session lost")
)

func jobKind(j wire.Job) (wire.JobKind, bool) {
	switch j.(type) {
	case *wire.FlakeJob:
		return wire.JobKindFlake, true
	case *wire.BuildJob:
		return wire.JobKindBuild, true
	}
	return 0, false
}
