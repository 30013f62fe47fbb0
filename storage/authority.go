package storage

import (
	"context"
	"database/sql"
	"errors"
)

// WorkerAccess is what the handshake authority needs about one worker ID,
// read from one snapshot.
type WorkerAccess struct {
	WorkerID string
	// Registrations are the peers to challenge, with their token hashes.
	Registrations []Registration
	// TeamWorker is set when the ID is a team worker; then Registrations
	// is empty, and GrantingProjects are the projects that accept it.
	TeamWorker       *TeamWorker
	GrantingProjects []Project
	// Deactivated workers are rejected with 403.
	Deactivated bool
}

// Known reports whether the ID has any credentials: an unknown worker is
// rejected with 403 "unknown worker".
func (a WorkerAccess) Known() bool { return len(a.Registrations) > 0 || a.TeamWorker != nil }

// WorkerAccess reads everything the authority decides a connecting worker
// on. An unknown worker ID is not an error: check Known.
func (db *DB) WorkerAccess(ctx context.Context, workerID string) (WorkerAccess, error) {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return WorkerAccess{}, err
	}
	access := WorkerAccess{WorkerID: workerID}
	err = db.readTx(ctx, func(tx *sql.Tx) error {
		var err error
		if access.Registrations, err = registrationsOfWorker(ctx, tx, workerID); err != nil {
			return err
		}
		if access.Deactivated, err = workerDeactivated(ctx, tx, workerID); err != nil {
			return err
		}
		w, err := teamWorker(ctx, tx, workerID)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		access.TeamWorker = &w
		access.GrantingProjects, err = teamGrantingProjects(ctx, tx, w.TeamID)
		return err
	})
	if err != nil {
		return WorkerAccess{}, err
	}
	return access, nil
}
