package storage

import (
	"context"
	"database/sql"
)

// ProjectWorker is one row of a project's worker list in the operator
// view: a worker the project registered, or a team worker of a team the
// project grants. Liveness comes from the server's sessions, not from here.
type ProjectWorker struct {
	WorkerID string
	// TeamID is set when the worker is a team worker reaching the project
	// through a grant; empty for the project's own registration.
	TeamID string
	WorkerSettings
	Deactivated bool
}

// ProjectWorkers lists a project's workers: its registrations first, then
// granted team workers, each by worker ID. An unknown project is ErrNotFound.
func (db *DB) ProjectWorkers(ctx context.Context, projectID string) ([]ProjectWorker, error) {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return nil, err
	}
	var workers []ProjectWorker
	err = db.readTx(ctx, func(tx *sql.Tx) error {
		if err := mustExist(ctx, tx, `SELECT 1 FROM projects WHERE id = $1`, projectID, "project %s"); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx,
			`SELECT r.worker_id AS worker_id, '' AS team_id, r.url AS url, r.enable_fetch, r.enable_eval, r.enable_build,
			        d.worker_id IS NOT NULL AS deactivated, 0 AS via_team
			 FROM worker_registrations r
			 LEFT JOIN worker_deactivations d ON d.worker_id = r.worker_id
			 WHERE r.peer_kind = 'project' AND r.peer_id = $1
			 UNION ALL
			 SELECT w.worker_id AS worker_id, w.team_id AS team_id, w.url AS url, w.enable_fetch, w.enable_eval, w.enable_build,
			        d.worker_id IS NOT NULL AS deactivated, 1 AS via_team
			 FROM team_workers w
			 JOIN team_grants g ON g.team_id = w.team_id
			 LEFT JOIN worker_deactivations d ON d.worker_id = w.worker_id
			 WHERE g.project_id = $1
			 ORDER BY via_team, worker_id`, projectID)
		workers, err = collect(rows, err, func(r *sql.Rows) (ProjectWorker, error) {
			var w ProjectWorker
			var url sql.NullString
			var viaTeam int
			err := r.Scan(&w.WorkerID, &w.TeamID, &url, &w.EnableFetch, &w.EnableEval, &w.EnableBuild,
				&w.Deactivated, &viaTeam)
			w.URL = url.String
			return w, err
		})
		return err
	})
	return workers, err
}
