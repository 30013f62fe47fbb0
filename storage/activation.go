package storage

import (
	"context"
	"database/sql"
)

// DeactivateWorker stops a worker ID from connecting (the authority
// answers 403 "worker is deactivated") until ActivateWorker. It applies
// to every registration and team worker of the ID, and it is idempotent.
// An ID without registrations or team worker is ErrNotFound.
func (db *DB) DeactivateWorker(ctx context.Context, workerID string) error {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		if err := workerMustBeKnown(ctx, tx, workerID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO worker_deactivations (worker_id, deactivated_at) VALUES ($1, $2)
			 ON CONFLICT (worker_id) DO NOTHING`, workerID, nowMillis())
		return err
	})
}

// ActivateWorker lifts a deactivation; it is idempotent. An ID without
// registrations or team worker is ErrNotFound.
func (db *DB) ActivateWorker(ctx context.Context, workerID string) error {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		if err := workerMustBeKnown(ctx, tx, workerID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM worker_deactivations WHERE worker_id = $1`, workerID)
		return err
	})
}

// WorkerDeactivated reports whether a worker ID is deactivated.
func (db *DB) WorkerDeactivated(ctx context.Context, workerID string) (bool, error) {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return false, err
	}
	return workerDeactivated(ctx, db.sql, workerID)
}

func workerDeactivated(ctx context.Context, q querier, workerID string) (bool, error) {
	return exists(ctx, q, `SELECT 1 FROM worker_deactivations WHERE worker_id = $1`, workerID)
}

func workerMustBeKnown(ctx context.Context, q querier, workerID string) error {
	known, err := exists(ctx, q,
		`SELECT 1 FROM worker_registrations WHERE worker_id = $1
		 UNION ALL
		 SELECT 1 FROM team_workers WHERE worker_id = $1`, workerID)
	if err != nil {
		return err
	}
	if !known {
		return notFound("worker %s has no registration or team worker", workerID)
	}
	return nil
}
