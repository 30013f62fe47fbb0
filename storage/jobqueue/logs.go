package jobqueue

import (
	"bytes"
	"context"
	"database/sql"

	"gradient.dev/gradient/storage/sqldb"
)

// AppendJobLog appends a chunk to a job's log. Chunks of one job are kept
// in the order they were appended. An unknown job is ErrNotFound.
func (q *Queue) AppendJobLog(ctx context.Context, jobID string, data []byte) error {
	jobID, err := sqldb.CanonicalUUID("job ID", jobID)
	if err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	// The next sequence number is computed in the statement; two appends
	// racing on PostgreSQL may pick the same one, and the loser retries.
	for range 10 {
		_, err = q.exec(ctx,
			`INSERT INTO job_logs (job_id, seq, data, created_at) VALUES
			 ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM job_logs WHERE job_id = $1), $2, $3)`,
			jobID, data, sqldb.NowMillis())
		switch sqldb.ConstraintOf(err) {
		case sqldb.UniqueViolation:
			continue
		case sqldb.ForeignKeyViolation:
			return sqldb.NotFound("job %s", jobID)
		}
		return err
	}
	return err
}

// BuildLog returns the log of a build: its job's chunks, in order (every
// attempt's, one after the other).
func (q *Queue) BuildLog(ctx context.Context, buildID string) ([]byte, error) {
	buildID, err := sqldb.CanonicalUUID("build ID", buildID)
	if err != nil {
		return nil, err
	}
	return q.readLog(ctx,
		`SELECT l.data FROM job_logs l JOIN jobs j ON j.id = l.job_id
		 WHERE j.build_id = $1 ORDER BY l.seq`,
		`SELECT 1 FROM builds WHERE id = $1`, "build", buildID)
}

// EvaluationLog returns the log of an evaluation's flake job.
func (q *Queue) EvaluationLog(ctx context.Context, evalID string) ([]byte, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	return q.readLog(ctx,
		`SELECT l.data FROM job_logs l JOIN jobs j ON j.id = l.job_id
		 WHERE j.evaluation_id = $1 AND j.kind = 'flake' ORDER BY l.seq`,
		`SELECT 1 FROM evaluations WHERE id = $1`, "evaluation", evalID)
}

func (q *Queue) readLog(ctx context.Context, query, existsQuery, what, id string) ([]byte, error) {
	rows, err := q.sql.QueryContext(ctx, query, id)
	chunks, err := sqldb.Collect(rows, err, func(r *sql.Rows) ([]byte, error) {
		var b []byte
		return b, r.Scan(&b)
	})
	if err != nil {
		return nil, err
	}
	if len(chunks) == 0 {
		ok, err := sqldb.Exists(ctx, q.sql, existsQuery, id)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, sqldb.NotFound("%s %s", what, id)
		}
		return []byte{}, nil
	}
	return bytes.Join(chunks, nil), nil
}
