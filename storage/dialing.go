package storage

import (
	"context"
	"database/sql"
)

// DialTarget is one URL at which the server dials a worker: all
// registrations of the worker ID at that URL, or its team worker.
type DialTarget struct {
	WorkerID      string
	URL           string
	Registrations []Registration
	TeamWorker    *TeamWorker
}

// DialTargets returns every registration and team worker with a URL,
// grouped by worker ID and URL and sorted by them. Deactivated workers
// are left out: the server does not dial them.
func (db *DB) DialTargets(ctx context.Context) ([]DialTarget, error) {
	var targets []DialTarget
	err := db.readTx(ctx, func(tx *sql.Tx) error {
		regs, err := scanRegistrations(tx.QueryContext(ctx,
			`SELECT `+registrationColumns+` FROM worker_registrations r
			 WHERE r.url IS NOT NULL
			   AND NOT EXISTS (SELECT 1 FROM worker_deactivations d WHERE d.worker_id = r.worker_id)
			 ORDER BY r.worker_id, r.url, r.peer_kind, r.peer_id`))
		if err != nil {
			return err
		}
		for _, r := range regs {
			last := len(targets) - 1
			if last >= 0 && targets[last].WorkerID == r.WorkerID && targets[last].URL == r.URL {
				targets[last].Registrations = append(targets[last].Registrations, r)
				continue
			}
			targets = append(targets, DialTarget{WorkerID: r.WorkerID, URL: r.URL, Registrations: []Registration{r}})
		}
		teamWorkers, err := scanTeamWorkers(tx.QueryContext(ctx,
			`SELECT `+teamWorkerColumns+` FROM team_workers w
			 WHERE w.url IS NOT NULL
			   AND NOT EXISTS (SELECT 1 FROM worker_deactivations d WHERE d.worker_id = w.worker_id)
			 ORDER BY w.worker_id`))
		if err != nil {
			return err
		}
		for i := range teamWorkers {
			w := &teamWorkers[i]
			targets = append(targets, DialTarget{WorkerID: w.WorkerID, URL: w.URL, TeamWorker: w})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return targets, nil
}
