package jobqueue

import (
	"context"
	"database/sql"
	"errors"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// Evaluations that forges start: pull requests' evaluations wait for an
// approval without a flake job, and the branch poller asks only for the
// branch's evaluations.

// ApproveEvaluation lets an evaluation that waits for approval run: it
// queues its flake job. An evaluation that does not wait (any more) is
// ErrConflict.
func (q *Queue) ApproveEvaluation(ctx context.Context, evalID string) error {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return err
	}
	return q.durableJobTx(ctx, func(tx *sql.Tx) error {
		var projectID string
		err := tx.QueryRowContext(ctx, `UPDATE evaluations SET approval = 'approved'
			WHERE id = $1 AND approval = 'waiting' AND status = 'queued' RETURNING project_id`, evalID).Scan(&projectID)
		if errors.Is(err, sql.ErrNoRows) {
			if ok, err := sqldb.Exists(ctx, tx, `SELECT 1 FROM evaluations WHERE id = $1`, evalID); err != nil || !ok {
				return errors.Join(err, sqldb.NotFound("evaluation %s", evalID))
			}
			return sqldb.Conflict("evaluation %s does not wait for approval", evalID)
		}
		if err != nil {
			return err
		}
		now := sqldb.NowMillis()
		_, err = tx.ExecContext(ctx,
			`INSERT INTO jobs (id, kind, evaluation_id, project_id, status, ready_at, attempts, created_at)
			 VALUES ($1, 'flake', $2, $3, 'pending', $4, 0, $4)`,
			storage.NewID(), evalID, projectID, now)
		return err
	})
}

// PullRequestEvaluations returns the evaluations of a project's pull
// request that have not ended (waiting ones included), oldest first.
func (q *Queue) PullRequestEvaluations(ctx context.Context, projectID string, number int) ([]storage.Evaluation, error) {
	projectID, err := sqldb.CanonicalUUID("project ID", projectID)
	if err != nil {
		return nil, err
	}
	rows, err := q.sql.QueryContext(ctx, `SELECT `+evaluationColumns+` FROM evaluations
		WHERE project_id = $1 AND pr_number = $2 AND status NOT IN ('succeeded', 'failed', 'cancelled')
		ORDER BY created_at, id`, projectID, int64(number))
	return sqldb.Collect(rows, err, func(r *sql.Rows) (storage.Evaluation, error) { return scanEvaluation(r) })
}

// LatestBranchEvaluation returns the project's newest evaluation that is
// not a pull request's (the branch poller's reference: a commit a push
// webhook evaluated is not evaluated again); ErrNotFound when it has none.
func (q *Queue) LatestBranchEvaluation(ctx context.Context, projectID string) (storage.Evaluation, error) {
	id, err := sqldb.CanonicalUUID("project ID", projectID)
	if err != nil {
		return storage.Evaluation{}, err
	}
	e, err := scanEvaluation(q.sql.QueryRowContext(ctx,
		`SELECT `+evaluationColumns+` FROM evaluations WHERE project_id = $1 AND pr_number IS NULL
		 ORDER BY created_at DESC, id DESC LIMIT 1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return storage.Evaluation{}, sqldb.NotFound("evaluation of project %s", id)
	}
	return e, err
}
