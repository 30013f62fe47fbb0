package jobqueue

import (
	"context"
	"database/sql"
)

// engine is what the queue does differently on SQLite (sqlite.go) and
// PostgreSQL (postgres.go): the statements whose SQL or plan differs, and
// how transactions lock rows and commit. Everything else is written once
// for both.
type engine interface {
	// parallelCompletions reports whether build completions from several
	// goroutines run side by side (and share statements) rather than
	// queueing for one writer (Queue.ParallelCompletions).
	parallelCompletions() bool

	// claim opens assignmentID of the pending job jobID for workerID
	// (ClaimJob).
	claim(ctx context.Context, jobID, workerID, assignmentID string) error
	// completeBuild ends a build job's assignment with the outputs' JSON
	// info and returns the jobs made pending (completeBuild).
	completeBuild(ctx context.Context, assignmentID, info string, end bool) ([]string, error)

	// durableTx is jobTx for the writes that create or drop queued work:
	// committed, they survive a power loss (durableJobTx).
	durableTx(ctx context.Context, fn func(tx *sql.Tx) error) error
	// lazyCommit lets tx commit without waiting for the disk, where the
	// engine would otherwise wait.
	lazyCommit(ctx context.Context, tx *sql.Tx) error
	// forUpdate is the row-locking suffix of a SELECT, "" where the
	// transaction holds the whole database's write lock.
	forUpdate() string
	// lockEvaluation locks an evaluation's row before finishEvaluationSQL.
	lockEvaluation(ctx context.Context, tx *sql.Tx, evalID string) error
	// edgesByDependency is build_edges as e, read by dependency.
	edgesByDependency() string

	// discoveredInserts says how AddDiscoveredDerivations inserts rows.
	discoveredInserts(ctx context.Context) (discoveredInserts, error)
	// queueBuildsByID runs update (ending in "AND id ") for the builds
	// ids of evalID ($1) and returns those it queued.
	queueBuildsByID(ctx context.Context, tx *sql.Tx, update, evalID string, ids []string) ([]string, error)
	// insertBuildJobs inserts a pending job ids[i] for each of several
	// builds at now.
	insertBuildJobs(ctx context.Context, tx *sql.Tx, job jobRef, ids, builds []string, now int64) error
	// queryByIDs runs query, whose %[1]s stands for "is one of ids", on
	// pool and hands each result to collect (queryByIDs).
	queryByIDs(ctx context.Context, pool *sql.DB, query string, ids []string, collect func(*sql.Rows, error) error) error
}

// discoveredInserts are the rows per INSERT of builds and of edges, and,
// for one row at a time, the statements prepared for them.
type discoveredInserts struct {
	buildsPer, edgesPer int
	build, edge         *sql.Stmt
}
