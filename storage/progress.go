package storage

import (
	"context"
	"database/sql"
)

// BuildsMark sums up an evaluation's builds that left waiting: how many
// are in each status, their attempts, and their latest start and end. A
// progress display compares two marks to tell whether any of those builds
// changed (started, ended, was requeued or moved to another worker)
// without reading every build; waiting builds, which an evaluation keeps
// adding, are left out.
type BuildsMark struct {
	counts                    [6]int64 // by status, queued … cancelled
	attempts                  int64
	lastStarted, lastFinished int64
}

// markStatuses are the statuses a mark counts, in its counts' order.
var markStatuses = [6]BuildStatus{BuildQueued, BuildBuilding, BuildSucceeded, BuildFailed, BuildDependencyFailed, BuildCancelled}

// EvaluationBuildsMark returns the mark of an evaluation's builds; an
// evaluation without builds (or unknown) has the zero mark.
func (db *DB) EvaluationBuildsMark(ctx context.Context, evalID string) (BuildsMark, error) {
	var m BuildsMark
	evalID, err := canonicalUUID("evaluation ID", evalID)
	if err != nil {
		return m, err
	}
	rows, err := db.sql.QueryContext(ctx, `SELECT status, COUNT(*), COALESCE(SUM(attempts), 0),
		COALESCE(MAX(started_at), 0), COALESCE(MAX(finished_at), 0)
		FROM builds WHERE evaluation_id = $1 AND status <> 'waiting' GROUP BY status`, evalID)
	if err != nil {
		return m, err
	}
	defer rows.Close()
	for rows.Next() {
		var status string
		var n, attempts, started, finished sql.NullInt64
		if err := rows.Scan(&status, &n, &attempts, &started, &finished); err != nil {
			return m, err
		}
		for i, s := range markStatuses {
			if BuildStatus(status) == s {
				m.counts[i] = n.Int64
			}
		}
		m.attempts += attempts.Int64
		m.lastStarted = max(m.lastStarted, started.Int64)
		m.lastFinished = max(m.lastFinished, finished.Int64)
	}
	return m, rows.Err()
}
