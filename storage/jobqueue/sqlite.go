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

// sqlite is the queue's engine on SQLite: the generic statement sequences
// in transactions that hold the database's one write lock (BEGIN
// IMMEDIATE, queued in the process by sqldb), so no row locks and no
// batching; no round trips, so one prepared row per statement.
type sqlite struct{ *Queue }

func (sqlite) parallelCompletions() bool { return false }

// claim is ClaimJob's generic statement sequence, in one transaction.
func (s sqlite) claim(ctx context.Context, jobID, workerID, assignmentID string) error {
	return s.jobTx(ctx, func(tx *sql.Tx) error {
		var kind storage.JobKind
		var buildID sql.NullString
		var evalID string
		err := s.txRow(ctx, tx,
			`UPDATE jobs SET status = 'assigned', attempts = attempts + 1
			 WHERE id = $1 AND status = 'pending' RETURNING kind, build_id, evaluation_id`,
			jobID).Scan(&kind, &buildID, &evalID)
		if errors.Is(err, sql.ErrNoRows) {
			return s.jobMissing(ctx, tx, jobID, "is not pending")
		}
		if err != nil {
			return err
		}
		now := sqldb.NowMillis()
		_, err = s.txExec(ctx, tx,
			`INSERT INTO job_assignments (id, job_id, worker_id, opened_at, instance_id) VALUES ($1, $2, $3, $4, $5)`,
			assignmentID, jobID, workerID, now, s.instanceArg())
		if sqldb.ConstraintOf(err) == sqldb.UniqueViolation {
			return sqldb.Conflict("job %s already has an open assignment", jobID)
		}
		if err != nil {
			return err
		}
		if kind == storage.JobBuild {
			_, err = s.txExec(ctx, tx,
				`UPDATE builds SET status = 'building', attempts = attempts + 1, worker_id = $2,
				 started_at = $3, finished_at = NULL WHERE id = $1`,
				buildID.String, workerID, now)
		} else {
			_, err = s.txExec(ctx, tx,
				`UPDATE evaluations SET status = `+claimedEvaluationStatus+`,
				 attempts = attempts + 1,
				 started_at = COALESCE(started_at, $2) WHERE id = $1`,
				evalID, now)
		}
		return err
	})
}

// completeBuild is CompleteBuild's generic statement sequence, in one
// transaction.
func (s sqlite) completeBuild(ctx context.Context, assignmentID, info string, end bool) ([]string, error) {
	var ready []string
	err := s.jobTx(ctx, func(tx *sql.Tx) error {
		ready = nil
		job, err := s.completeAssignment(ctx, tx, assignmentID, storage.JobBuild)
		if err != nil {
			return err
		}
		var drv string
		err = s.txRow(ctx, tx,
			`UPDATE builds SET status = 'succeeded', output_info = $2, finished_at = $3,
			 failure_kind = NULL, error = NULL WHERE id = $1 RETURNING drv_path`,
			job.buildID, info, sqldb.NowMillis()).Scan(&drv)
		if err != nil {
			return err
		}
		builds, err := s.readyDependents(ctx, tx, job.evalID, drv)
		if err != nil {
			return err
		}
		if ready, err = s.Queue.insertBuildJobs(ctx, tx, job, builds); err != nil {
			return err
		}
		if len(ready) == 0 && end {
			return s.finishEvaluationIfDone(ctx, tx, job.evalID)
		}
		return nil
	})
	return ready, err
}

// durableTx runs fn on a connection switched to synchronous=FULL for it:
// the pool's connections run with synchronous=NORMAL, which in WAL mode
// survives a crash of the process but may lose the last commits to one of
// the machine.
func (s sqlite) durableTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	defer s.base.LockWriter()()
	conn, err := s.sql.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `PRAGMA synchronous = FULL`); err != nil {
		return err
	}
	defer func() {
		// Back to the pool's setting; should this fail, the connection
		// only stays slower.
		conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA synchronous = NORMAL`)
	}()
	tx, err := conn.BeginTx(ctx, nil)
	return sqldb.RunTx(tx, err, fn)
}

// lazyCommit does nothing: SQLite runs with synchronous=NORMAL in WAL
// mode, which already trades the same durability for speed.
func (sqlite) lazyCommit(context.Context, *sql.Tx) error { return nil }

// forUpdate is empty: a SQLite transaction holds the database's write
// lock, and SQLite has no such clause.
func (sqlite) forUpdate() string { return `` }

// lockEvaluation does nothing: the transaction holds the write lock.
func (sqlite) lockEvaluation(context.Context, *sql.Tx, string) error { return nil }

// edgesByDependency names the index: SQLite's planner, without
// statistics, otherwise walks every edge of the evaluation.
func (sqlite) edgesByDependency() string {
	return "build_edges e INDEXED BY build_edges_by_dependency"
}

// discoveredInserts are one prepared row at a time: with no round trips,
// that is cheaper than a statement of many rows, which was parsed anew
// for every batch and whose $n parameters take time quadratic in their
// number to bind.
func (s sqlite) discoveredInserts(ctx context.Context) (discoveredInserts, error) {
	build, err := s.prepared(ctx, discoveredBuildsSQL(1))
	if err != nil {
		return discoveredInserts{}, err
	}
	edge, err := s.prepared(ctx, discoveredEdgesSQL(1))
	if err != nil {
		return discoveredInserts{}, err
	}
	return discoveredInserts{buildsPer: 1, edgesPer: 1, build: build, edge: edge}, nil
}

// queueBuildsByID runs update once per sqldb.InListMax IDs.
func (sqlite) queueBuildsByID(ctx context.Context, tx *sql.Tx, update, evalID string, ids []string) ([]string, error) {
	var out []string
	for len(ids) > 0 {
		n := min(len(ids), sqldb.InListMax)
		args, in := sqldb.InList([]any{evalID}, ids[:n])
		ids = ids[n:]
		rows, err := tx.QueryContext(ctx, update+`IN (`+in+`) RETURNING id`, args...)
		part, err := sqldb.Collect(rows, err, scanString)
		if err != nil {
			return nil, err
		}
		out = append(out, part...)
	}
	return out, nil
}

// insertBuildJobs inserts 200 rows per statement.
func (sqlite) insertBuildJobs(ctx context.Context, tx *sql.Tx, job jobRef, ids, builds []string, now int64) error {
	for start := 0; start < len(builds); start += 200 {
		end := min(start+200, len(builds))
		var sb strings.Builder
		sb.WriteString(`INSERT INTO jobs (id, kind, evaluation_id, build_id, project_id, status, ready_at, attempts, created_at) VALUES `)
		args := []any{job.evalID, job.projectID, now}
		for i := start; i < end; i++ {
			if i > start {
				sb.WriteString(", ")
			}
			n := len(args)
			fmt.Fprintf(&sb, "($%d, 'build', $1, $%d, $2, 'pending', $3, 0, $3)", n+1, n+2)
			args = append(args, ids[i], builds[i])
		}
		if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
			return err
		}
	}
	return nil
}

// queryByIDs runs query once per sqldb.InListMax IDs.
func (s sqlite) queryByIDs(ctx context.Context, _ *sql.DB, query string, ids []string, collect func(*sql.Rows, error) error) error {
	for len(ids) > 0 {
		n := min(len(ids), sqldb.InListMax)
		args, in := sqldb.InList(nil, ids[:n])
		ids = ids[n:]
		rows, err := s.sql.QueryContext(ctx, fmt.Sprintf(query, "IN ("+in+")"), args...)
		if err := collect(rows, err); err != nil {
			return err
		}
	}
	return nil
}
