package jobqueue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// What the dashboard reads of the job queue: an evaluation's builds in
// keyset pages, the counts per status, a build log's chunks after a
// point, the overview's numbers; and the restart of an evaluation's
// failed builds.

// BuildPageOrder is the order of an evaluation's builds on the
// dashboard: what needs attention first, succeeded last.
var BuildPageOrder = []storage.BuildStatus{storage.BuildFailed, storage.BuildDependencyFailed, storage.BuildBuilding, storage.BuildQueued,
	storage.BuildWaiting, storage.BuildCancelled, storage.BuildSucceeded}

// BuildCursor is where a page of builds ends: the status group and the
// last build ID of the page. The zero cursor starts at the beginning.
type BuildCursor struct {
	Status storage.BuildStatus
	ID     string
}

// IsZero reports whether c is the start.
func (c BuildCursor) IsZero() bool { return c.Status == "" && c.ID == "" }

// MaxBuildPage bounds one page of builds.
const MaxBuildPage = 1000

// BuildsPage returns up to limit builds of an evaluation after the
// cursor, in BuildPageOrder and by ID within a status (only status's
// builds when status is not ""), and the cursor of the next page (zero
// when this is the last). Each status group is one index range scan
// (builds_by_status_id), so a page costs the same on page 1 and page 200
// of an evaluation with 20,000 builds.
func (q *Queue) BuildsPage(ctx context.Context, evalID string, status storage.BuildStatus, after BuildCursor, limit int) ([]storage.Build, BuildCursor, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, BuildCursor{}, err
	}
	if limit <= 0 || limit > MaxBuildPage {
		return nil, BuildCursor{}, sqldb.Invalid("page size %d: want 1 to %d", limit, MaxBuildPage)
	}
	order := BuildPageOrder
	if status != "" {
		order = []storage.BuildStatus{status}
	}
	start := 0
	if !after.IsZero() {
		start = -1
		for i, s := range order {
			if s == after.Status {
				start = i
			}
		}
		if start < 0 {
			return nil, BuildCursor{}, sqldb.Invalid("page cursor status %q", after.Status)
		}
	}
	// One more than asked tells whether a next page exists. The ORDER BY
	// names the index's columns, equal within the query, so that no plan
	// (a generic one knows neither the status nor how rare it is) walks
	// the primary key in ID order filtering every build of the table.
	var builds []storage.Build
	for i := start; i < len(order) && len(builds) <= limit; i++ {
		s, from := order[i], ""
		if i == start {
			from = after.ID
		}
		rows, err := q.sql.QueryContext(ctx, `SELECT `+buildColumns+` FROM builds
			WHERE evaluation_id = $1 AND status = $2 AND id > $3 ORDER BY evaluation_id, status, id LIMIT `+fmt.Sprint(limit+1-len(builds)),
			evalID, string(s), from)
		part, err := sqldb.Collect(rows, err, func(r *sql.Rows) (storage.Build, error) { return scanBuild(r) })
		if err != nil {
			return nil, BuildCursor{}, err
		}
		builds = append(builds, part...)
	}
	var next BuildCursor
	if len(builds) > limit {
		builds = builds[:limit]
		last := builds[limit-1]
		next = BuildCursor{Status: last.Status, ID: last.ID}
	}
	return builds, next, nil
}

// BuildStatusCounts returns how many builds of an evaluation are in each
// status.
func (q *Queue) BuildStatusCounts(ctx context.Context, evalID string) (map[storage.BuildStatus]int, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	rows, err := q.sql.QueryContext(ctx,
		`SELECT status, COUNT(*) FROM builds WHERE evaluation_id = $1 GROUP BY status`, evalID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := map[storage.BuildStatus]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		counts[storage.BuildStatus(s)] = n
	}
	return counts, rows.Err()
}

// LogChunk is one appended piece of a job's log.
type LogChunk struct {
	Seq  int64
	Data []byte
}

// BuildLogChunks returns a build's log chunks after sequence number
// afterSeq (0: from the start), in order, at most limit of them.
func (q *Queue) BuildLogChunks(ctx context.Context, buildID string, afterSeq int64, limit int) ([]LogChunk, error) {
	buildID, err := sqldb.CanonicalUUID("build ID", buildID)
	if err != nil {
		return nil, err
	}
	rows, err := q.sql.QueryContext(ctx,
		`SELECT l.seq, l.data FROM job_logs l JOIN jobs j ON j.id = l.job_id
		 WHERE j.build_id = $1 AND l.seq > $2 ORDER BY l.seq LIMIT `+fmt.Sprint(max(limit, 1)), buildID, afterSeq)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (LogChunk, error) {
		var c LogChunk
		return c, r.Scan(&c.Seq, &c.Data)
	})
}

// Overview is the dashboard's first page: what runs, how fast, what
// failed lately.
type Overview struct {
	EvaluationsRunning int // fetching, evaluating or building
	EvaluationsQueued  int
	// BuildsLast10Min is how many builds ended (succeeded or failed) in
	// the last ten minutes.
	BuildsLast10Min      int
	FailedBuildsDay      int
	FailedEvaluationsDay int
	// RecentFailures are the latest failed builds of the last day.
	RecentFailures []storage.Build
}

// activeOrRecent selects the evaluations of the last day and those still
// running: the overview's numbers look at their builds only, through the
// evaluation indexes, never at every build ever made.
const activeOrRecent = `(e.created_at > $1 OR e.status IN ('queued', 'fetching', 'evaluating', 'building'))`

// ReadOverview reads the overview at now.
func (q *Queue) ReadOverview(ctx context.Context, now time.Time) (Overview, error) {
	var o Overview
	day := now.Add(-24 * time.Hour).UnixMilli()
	err := q.sql.QueryRowContext(ctx, `SELECT
		COALESCE(SUM(CASE WHEN status IN ('fetching', 'evaluating', 'building') THEN 1 ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN status = 'failed' AND finished_at > $1 THEN 1 ELSE 0 END), 0)
		FROM evaluations e WHERE `+activeOrRecent, day).Scan(&o.EvaluationsRunning, &o.EvaluationsQueued, &o.FailedEvaluationsDay)
	if err != nil {
		return o, err
	}
	err = q.sql.QueryRowContext(ctx, `SELECT
		COALESCE(SUM(CASE WHEN b.finished_at > $2 AND b.status IN ('succeeded', 'failed') THEN 1 ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN b.finished_at > $1 AND b.status = 'failed' THEN 1 ELSE 0 END), 0)
		FROM builds b JOIN evaluations e ON e.id = b.evaluation_id WHERE `+activeOrRecent,
		day, now.Add(-10*time.Minute).UnixMilli()).Scan(&o.BuildsLast10Min, &o.FailedBuildsDay)
	if err != nil {
		return o, err
	}
	rows, err := q.sql.QueryContext(ctx, `SELECT `+buildColumnsOf("b")+` FROM builds b
		JOIN evaluations e ON e.id = b.evaluation_id WHERE `+activeOrRecent+`
		AND b.status = 'failed' AND b.finished_at > $1 ORDER BY b.finished_at DESC LIMIT 20`, day)
	o.RecentFailures, err = sqldb.Collect(rows, err, func(r *sql.Rows) (storage.Build, error) { return scanBuild(r) })
	return o, err
}

// buildColumnsOf is buildColumns of the builds table named alias.
func buildColumnsOf(alias string) string {
	cols := strings.Split(buildColumns, ",")
	for i, c := range cols {
		cols[i] = alias + "." + strings.TrimSpace(c)
	}
	return strings.Join(cols, ", ")
}

// RestartFailedBuilds runs an evaluation's failed builds again: each
// failed build is queued with a fresh attempt budget (its log keeps the
// earlier attempts'), the builds that failed only because of them wait
// again, and the evaluation is building again. Everything that
// succeeded stays built, and what the builds need is pulled from the
// caches as on any run. It returns the jobs it made pending. An
// evaluation that is not failed or building, or has no failed build
// (e.g. its evaluation itself failed), is ErrConflict.
func (q *Queue) RestartFailedBuilds(ctx context.Context, evalID string) ([]string, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	var jobs []string
	err = q.durableJobTx(ctx, func(tx *sql.Tx) error {
		jobs = nil
		var status storage.EvaluationStatus
		err := tx.QueryRowContext(ctx,
			`SELECT status FROM evaluations WHERE id = $1`+q.engine.forUpdate(), evalID).Scan(&status)
		if errors.Is(err, sql.ErrNoRows) {
			return sqldb.NotFound("evaluation %s", evalID)
		}
		if err != nil {
			return err
		}
		if status != storage.EvaluationFailed && status != storage.EvaluationBuilding {
			return sqldb.Conflict("evaluation %s is %s: only a failed or building evaluation's failed builds restart", evalID, status)
		}
		now := sqldb.NowMillis()
		rows, err := tx.QueryContext(ctx,
			`UPDATE jobs SET status = 'pending', ready_at = $2, attempts = 0, lost_workers = 0
			 WHERE evaluation_id = $1 AND kind = 'build' AND status = 'failed'
			 AND build_id IN (SELECT id FROM builds WHERE evaluation_id = $1 AND status = 'failed')
			 RETURNING id`, evalID, now)
		if jobs, err = sqldb.Collect(rows, err, scanString); err != nil {
			return err
		}
		if len(jobs) == 0 {
			return sqldb.Conflict("evaluation %s has no failed build to restart", evalID)
		}
		for _, q := range []string{
			`UPDATE builds SET status = 'queued', failure_kind = NULL, error = NULL, finished_at = NULL
			 WHERE evaluation_id = $1 AND status = 'failed'`,
			// Their dependents get jobs again when they are ready.
			`DELETE FROM jobs WHERE evaluation_id = $1 AND status = 'cancelled'
			 AND build_id IN (SELECT id FROM builds WHERE evaluation_id = $1 AND status = 'dependency_failed')`,
			`UPDATE builds SET status = 'waiting', error = NULL, finished_at = NULL
			 WHERE evaluation_id = $1 AND status = 'dependency_failed'`,
			`UPDATE evaluations SET status = 'building', finished_at = NULL,
			 error = CASE WHEN error = 'builds failed' THEN NULL ELSE error END WHERE id = $1`,
		} {
			if _, err := tx.ExecContext(ctx, q, evalID); err != nil {
				return err
			}
		}
		return nil
	})
	return jobs, err
}
