package storage

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// TeamWorker is a worker owned by a team rather than registered by peers.
// It presents one token for the team ID, and every project that grants
// the team's workers accepts it.
type TeamWorker struct {
	WorkerID  string
	TeamID    string
	TokenHash string // argon2id PHC string
	WorkerSettings
	// DialTokenSealed: see Registration.DialTokenSealed.
	DialTokenSealed []byte
	CreatedAt       time.Time
}

const teamWorkerColumns = `worker_id, team_id, token_hash, url,
	enable_fetch, enable_eval, enable_build, created_at, dial_token_sealed`

func scanTeamWorker(row interface{ Scan(...any) error }) (TeamWorker, error) {
	var w TeamWorker
	var url, sealed sql.NullString
	var created int64
	err := row.Scan(&w.WorkerID, &w.TeamID, &w.TokenHash, &url,
		&w.EnableFetch, &w.EnableEval, &w.EnableBuild, &created, &sealed)
	if err != nil {
		return w, err
	}
	w.URL = url.String
	w.CreatedAt = fromMillis(created)
	w.DialTokenSealed, err = decodeSealed(sealed)
	return w, err
}

func scanTeamWorkers(rows *sql.Rows, err error) ([]TeamWorker, error) {
	return collect(rows, err, func(r *sql.Rows) (TeamWorker, error) { return scanTeamWorker(r) })
}

// CreateTeamWorker makes workerID a worker of a team and returns it with
// its token, shown once; only the hash is stored.
//
// Errors: an unknown team is ErrNotFound; a worker ID that already is a
// team worker or has registrations is ErrConflict.
func (db *DB) CreateTeamWorker(ctx context.Context, teamID, workerID string, settings WorkerSettings) (TeamWorker, string, error) {
	teamID, err := canonicalUUID("team ID", teamID)
	if err != nil {
		return TeamWorker{}, "", err
	}
	workerID, err = canonicalUUID("worker ID", workerID)
	if err != nil {
		return TeamWorker{}, "", err
	}
	if err := settings.validate(); err != nil {
		return TeamWorker{}, "", err
	}
	token, hash, err := newWorkerToken()
	if err != nil {
		return TeamWorker{}, "", err
	}
	w := TeamWorker{
		WorkerID: workerID, TeamID: teamID, TokenHash: hash,
		WorkerSettings: settings, CreatedAt: fromMillis(nowMillis()),
	}
	err = db.inTx(ctx, func(tx *sql.Tx) error {
		if err := mustExist(ctx, tx, `SELECT 1 FROM teams WHERE id = $1`, teamID, "team %s"); err != nil {
			return err
		}
		if err := claimWorkerID(ctx, tx, workerID, ownerTeam); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO team_workers (worker_id, team_id, token_hash, url,
			     enable_fetch, enable_eval, enable_build, created_at)
			 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			workerID, teamID, hash, settings.nullableURL(),
			settings.EnableFetch, settings.EnableEval, settings.EnableBuild, w.CreatedAt.UnixMilli())
		switch constraintOf(err) {
		case uniqueViolation:
			return conflict("worker %s already is a team worker", workerID)
		case foreignKeyViolation: // a registration took the ID concurrently
			return workerIDTaken(workerID, ownerRegistration)
		}
		return err
	})
	if err != nil {
		return TeamWorker{}, "", err
	}
	return w, token, nil
}

// TeamWorker returns the team worker with workerID; ErrNotFound when the
// ID is not a team worker.
func (db *DB) TeamWorker(ctx context.Context, workerID string) (TeamWorker, error) {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return TeamWorker{}, err
	}
	return teamWorker(ctx, db.sql, workerID)
}

func teamWorker(ctx context.Context, q querier, workerID string) (TeamWorker, error) {
	w, err := scanTeamWorker(q.QueryRowContext(ctx,
		`SELECT `+teamWorkerColumns+` FROM team_workers WHERE worker_id = $1`, workerID))
	if errors.Is(err, sql.ErrNoRows) {
		return TeamWorker{}, notFound("team worker %s", workerID)
	}
	return w, err
}

// ListTeamWorkers returns a team's workers, by worker ID.
func (db *DB) ListTeamWorkers(ctx context.Context, teamID string) ([]TeamWorker, error) {
	teamID, err := canonicalUUID("team ID", teamID)
	if err != nil {
		return nil, err
	}
	return scanTeamWorkers(db.sql.QueryContext(ctx,
		`SELECT `+teamWorkerColumns+` FROM team_workers WHERE team_id = $1 ORDER BY worker_id`, teamID))
}

// UpdateTeamWorker replaces the URL and job kinds of a team worker.
// Removing the URL drops the sealed dial token: the server no longer dials.
func (db *DB) UpdateTeamWorker(ctx context.Context, workerID string, settings WorkerSettings) error {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	if err := settings.validate(); err != nil {
		return err
	}
	res, err := db.exec(ctx,
		`UPDATE team_workers SET url = $1, enable_fetch = $2, enable_eval = $3, enable_build = $4,
		     dial_token_sealed = CASE WHEN $6 THEN dial_token_sealed ELSE NULL END
		 WHERE worker_id = $5`,
		settings.nullableURL(), settings.EnableFetch, settings.EnableEval, settings.EnableBuild, workerID,
		settings.URL != "")
	return affectedOne(res, err, "team worker %s", workerID)
}

// RotateTeamWorkerToken replaces a team worker's token and returns the
// new one, shown once. The old token stops working at once, and its sealed
// dial copy is dropped until the server seals the new one.
func (db *DB) RotateTeamWorkerToken(ctx context.Context, workerID string) (string, error) {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return "", err
	}
	token, hash, err := newWorkerToken()
	if err != nil {
		return "", err
	}
	res, err := db.exec(ctx, `UPDATE team_workers SET token_hash = $1, dial_token_sealed = NULL WHERE worker_id = $2`, hash, workerID)
	if err := affectedOne(res, err, "team worker %s", workerID); err != nil {
		return "", err
	}
	return token, nil
}

// DeleteTeamWorker removes a team worker.
func (db *DB) DeleteTeamWorker(ctx context.Context, workerID string) error {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	res, err := db.exec(ctx, `DELETE FROM team_workers WHERE worker_id = $1`, workerID)
	return affectedOne(res, err, "team worker %s", workerID)
}
