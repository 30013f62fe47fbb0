package jobqueue

import (
	"context"
	"database/sql"
	"slices"
	"strings"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// Recovery of interrupted work across server instances (README "Several
// instances", docs/protocol/jobs.md §12.6). Every assignment names the
// instance whose job loop opened it (ForInstance; NULL: none recorded).
// An instance is dead when its server_instances row is gone (it stopped)
// or its lease has passed (it crashed, or lost the database for longer
// than its lease), by the database's clock.
//
//   - At start an instance recovers its own previous run's assignments,
//     the ownerless ones and dead instances' (RecoverInterruptedWork);
//     a live instance's are left alone.
//   - While it runs, it recovers dead instances' assignments on every
//     pass (RecoverDeadInstances).
//
// Exactly once across instances: an assignment is recovered by the
// transaction whose UPDATE closes it, and that UPDATE matches only open
// assignments. Two instances recovering at once lock the rows they
// select (FOR UPDATE SKIP LOCKED on PostgreSQL: the second skips the
// rows the first holds instead of waiting for them; SQLite has one
// writer), and PostgreSQL re-checks "closed_at IS NULL" on a row whose
// lock it waited for (a completion's), so a row closed meanwhile is not
// matched. The job is queued again in the same transaction, only for the
// assignments that UPDATE returned: a crash before the commit recovers
// nothing, after it everything, and no assignment's job is queued twice
// (requeue also changes a job only while it is assigned: the one open
// assignment per job is the one closed).
// A completion or failure reported later under a recovered assignment
// finds it closed and is refused (ErrConflict), as a report of a lost
// worker's assignment is.

// recoverChunk bounds the assignments one recovery transaction closes, so
// a dead instance with thousands of running jobs does not hold their
// locks in one long transaction.
const recoverChunk = 500

// recovered is an assignment a recovery closed.
type recovered struct {
	assignmentID, jobID, instanceID string
	requeued                        bool // its job is pending again
}

// liveInstance is "the assignment a's instance is live", as SQL.
func (q *Queue) liveInstance() string {
	return `EXISTS (SELECT 1 FROM server_instances i WHERE i.id = a.instance_id AND i.lease_until > ` +
		q.store.ClockMillisSQL() + `)`
}

// skipLocked is the locking suffix of a recovery's SELECT: rows another
// recovery (or a completion) holds are skipped, not waited for.
func (q *Queue) skipLocked() string {
	if q.engine.forUpdate() == "" {
		return "" // SQLite: the transaction holds the write lock
	}
	return ` FOR UPDATE OF a SKIP LOCKED`
}

// recoverWhere closes, as outcome, the open assignments a (job_assignments)
// for which cond holds, recoverChunk per transaction, and queues their
// jobs again without counting the attempt. cond's arguments start at $4.
func (q *Queue) recoverWhere(ctx context.Context, outcome, cond string, args ...any) ([]recovered, error) {
	query := `UPDATE job_assignments SET closed_at = $1, outcome = $2
		WHERE id IN (SELECT a.id FROM job_assignments a WHERE a.closed_at IS NULL AND (` + cond + `)
		             ORDER BY a.id LIMIT $3` + q.skipLocked() + `)
		  AND closed_at IS NULL
		RETURNING id, job_id, instance_id`
	var all []recovered
	for {
		var chunk []recovered
		err := q.jobTx(ctx, func(tx *sql.Tx) error {
			chunk = nil
			rows, err := tx.QueryContext(ctx, query, append([]any{sqldb.NowMillis(), outcome, recoverChunk}, args...)...)
			chunk, err = sqldb.Collect(rows, err, func(r *sql.Rows) (recovered, error) {
				var c recovered
				var instance sql.NullString
				err := r.Scan(&c.assignmentID, &c.jobID, &instance)
				c.instanceID = instance.String
				return c, err
			})
			if err != nil {
				return err
			}
			// By job ID: two transactions requeueing jobs lock them in
			// one order.
			slices.SortFunc(chunk, func(x, y recovered) int { return strings.Compare(x.jobID, y.jobID) })
			for i := range chunk {
				_, _, changed, err := q.requeue(ctx, tx, chunk[i].jobID, true, nil, nil)
				if err != nil {
					return err
				}
				chunk[i].requeued = changed
			}
			return nil
		})
		if err != nil {
			return all, err
		}
		all = append(all, chunk...)
		if len(chunk) < recoverChunk {
			return all, nil
		}
	}
}

// RecoverInterruptedWork runs at server start, before any session: it
// closes ("server restarted") the open assignments of this instance's
// previous run (the queue's ForInstance), those that name no instance and
// those of dead instances, and makes their jobs pending again without
// counting the attempt (their builds queued, their evaluations queued).
// Assignments of live other instances are left alone: their workers still
// report to them. On SQLite, one server process by design, every open
// assignment is a previous run's and is recovered. It then readies stranded builds and ends finished
// evaluations (a crash between a completion's steps). It returns how many
// assignments it closed; running it again changes nothing.
func (q *Queue) RecoverInterruptedWork(ctx context.Context) (int, error) {
	// A queue without an instance has no previous run of its own beyond
	// the ownerless assignments ("" matches no instance ID).
	cond := `a.instance_id IS NULL OR a.instance_id = $4 OR NOT ` + q.liveInstance()
	if q.store.Engine() != storage.EnginePostgres {
		// SQLite is one server process (README "Several instances"): any
		// other instance's assignment is a previous run's, even one whose
		// lease has not passed yet (a restart under a new random ID right
		// after a crash).
		cond = `a.instance_id IS NULL OR a.instance_id = $4 OR true`
	}
	done, err := q.recoverWhere(ctx, OutcomeServerRestart, cond, q.instance)
	if err != nil {
		return len(done), err
	}
	// A crash between a build's commit and its dependents' readying or
	// its evaluation's end.
	if _, err := q.ReadyStrandedBuilds(ctx); err != nil {
		return len(done), err
	}
	_, err = q.FinishDoneEvaluations(ctx)
	return len(done), err
}

// LostInstance is a dead server instance whose open assignments
// RecoverDeadInstances closed.
type LostInstance struct {
	ID string
	// Jobs are the jobs it made pending again (by job ID).
	Jobs []string
}

// DeadInstancesHolding lists the dead instances, other than the queue's
// own, that hold open assignments: what RecoverDeadInstances would
// recover. It reads the distinct instances of the open assignments by
// skipping through the partial index job_assignments_open_by_instance
// (one probe per instance, not per assignment) and reads no job: cheap
// enough for every pass.
func (q *Queue) DeadInstancesHolding(ctx context.Context) ([]string, error) {
	rows, err := q.sql.QueryContext(ctx, deadInstancesSQL(q.store.ClockMillisSQL()), q.instance)
	return sqldb.Collect(rows, err, scanString)
}

// deadInstancesSQL: a loose index scan (a recursive step per distinct
// instance ID, each the next one in the index after the last) for the
// instances holding open assignments, less the live ones and $1.
func deadInstancesSQL(clock string) string {
	return `WITH RECURSIVE held (id) AS (
		SELECT (SELECT instance_id FROM job_assignments WHERE closed_at IS NULL AND instance_id IS NOT NULL ORDER BY instance_id LIMIT 1)
		UNION ALL
		SELECT (SELECT instance_id FROM job_assignments WHERE closed_at IS NULL AND instance_id > held.id ORDER BY instance_id LIMIT 1)
		FROM held WHERE held.id IS NOT NULL)
	SELECT id FROM held WHERE id IS NOT NULL AND id <> $1
	  AND NOT EXISTS (SELECT 1 FROM server_instances i WHERE i.id = held.id AND i.lease_until > ` + clock + `)`
}

// RecoverDeadInstances closes ("server instance lost") the open
// assignments of dead instances other than the queue's own and makes
// their jobs pending again without counting the attempt, exactly once
// however many live instances run it at the same moment (see above). It
// returns, per dead instance, the jobs it made pending; nothing when no
// instance holding work is dead (one cheap read, DeadInstancesHolding).
// Assignments that name no instance are left to RecoverInterruptedWork:
// a job loop without an instance may be alive.
func (q *Queue) RecoverDeadInstances(ctx context.Context) ([]LostInstance, error) {
	dead, err := q.DeadInstancesHolding(ctx)
	if err != nil || len(dead) == 0 {
		return nil, err
	}
	byID := map[string]int{} // index in out
	var out []LostInstance
	for len(dead) > 0 {
		n := min(len(dead), sqldb.InListMax)
		// $1-$3 are recoverWhere's, $4 the queue's instance.
		args, in := sqldb.InList([]any{nil, nil, nil, q.instance}, dead[:n])
		dead = dead[n:]
		// Dead is decided again in the statement: an instance that
		// renewed its lease since the read above keeps its work.
		done, err := q.recoverWhere(ctx, OutcomeInstanceLost,
			`a.instance_id IN (`+in+`) AND a.instance_id <> $4 AND NOT `+q.liveInstance(), args[3:]...)
		for _, r := range done {
			i, ok := byID[r.instanceID]
			if !ok {
				i = len(out)
				byID[r.instanceID] = i
				out = append(out, LostInstance{ID: r.instanceID})
			}
			if r.requeued {
				out[i].Jobs = append(out[i].Jobs, r.jobID)
			}
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// RecoveredAssignments returns those of the assignments (by ID) that a
// recovery closed: another instance took their instance for dead
// (OutcomeInstanceLost), or an instance starting under the same ID
// recovered them (OutcomeServerRestart). A job loop that still holds them
// was paused past its lease; its workers' reports are refused.
func (q *Queue) RecoveredAssignments(ctx context.Context, ids []string) ([]storage.OpenAssignment, error) {
	return queryByIDs(ctx, q, recoveredAssignmentsSQL, ids, scanOpenAssignment)
}

// recoveredAssignmentsSQL reads the assignments %[1]s closed by a
// recovery, by primary key.
const recoveredAssignmentsSQL = `SELECT ` + openAssignmentColumns + ` FROM job_assignments
	WHERE outcome IN ('` + OutcomeInstanceLost + `', '` + OutcomeServerRestart + `') AND id %[1]s`
