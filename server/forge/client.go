package forge

import (
	"context"
	"fmt"
	"time"
)

// State is a commit status's state, in GitHub's and Gitea's words.
type State string

// The states a status can have.
const (
	StatePending State = "pending"
	StateSuccess State = "success"
	StateFailure State = "failure"
	StateError   State = "error"
)

// Status is a commit status to post. Context names the check (one per
// evaluation, or per attribute); the latest status per (Commit, Context)
// is what the forge shows. GitHub keeps 140 characters of Description
// (the client truncates); GitLab has no "error" or "failure" and gets
// "failed", and a pending status there is "pending" ("running" once the
// caller says so through Running).
type Status struct {
	Commit, Context string
	State           State
	Description     string
	TargetURL       string
	// Running marks a pending status whose evaluation has started: GitLab
	// shows it as "running"; the others see "pending".
	Running bool
}

// Client talks to one repository on one forge.
type Client interface {
	// PostStatus sets a commit's status for its context.
	PostStatus(ctx context.Context, s Status) error
	// CanWrite says whether user has write (push) access to the
	// repository: on GitHub a collaborator permission of admin, maintain
	// or write; on Gitea the collaborator permission (write, admin,
	// owner); on GitLab a member access level of Developer (30) or more.
	CanWrite(ctx context.Context, user string) (bool, error)
	// Check answers whether the credentials can read the repository and
	// post a status, and if not, what failed.
	Check(ctx context.Context) error
}

// RetryableError is a failure worth trying again: the forge was
// unreachable, failed, or asked us to slow down, or the caller's context
// ended first (errors.Is(err, context.Canceled) tells that apart).
type RetryableError struct {
	// After is how long the forge asked us to wait (Retry-After or its
	// rate-limit reset); 0 leaves the wait to the caller's own backoff.
	After time.Duration
	Err   error
}

func (e *RetryableError) Error() string {
	if e.After > 0 {
		return fmt.Sprintf("%v (retry after %v)", e.Err, e.After)
	}
	return e.Err.Error()
}

func (e *RetryableError) Unwrap() error { return e.Err }
