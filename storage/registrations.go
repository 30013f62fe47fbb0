package storage

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// Registration is a peer's consent to work with a worker ID. The worker
// proves itself with the token whose hash is stored here.
type Registration struct {
	Peer      Peer
	WorkerID  string
	TokenHash string // argon2id PHC string, or hex SHA-256 from older data
	WorkerSettings
	// DialTokenSealed is the token sealed by the server, which presents it
	// when it dials the worker at URL; nil when it cannot (no URL, or not
	// sealed yet). Storage never sees the key.
	DialTokenSealed []byte
	CreatedAt       time.Time
}

const registrationColumns = `peer_kind, peer_id, worker_id, token_hash, url,
	enable_fetch, enable_eval, enable_build, created_at, dial_token_sealed`

func scanRegistration(row interface{ Scan(...any) error }) (Registration, error) {
	var r Registration
	var url, sealed sql.NullString
	var created int64
	err := row.Scan(&r.Peer.Kind, &r.Peer.ID, &r.WorkerID, &r.TokenHash, &url,
		&r.EnableFetch, &r.EnableEval, &r.EnableBuild, &created, &sealed)
	if err != nil {
		return r, err
	}
	r.URL = url.String
	r.CreatedAt = fromMillis(created)
	r.DialTokenSealed, err = decodeSealed(sealed)
	return r, err
}

func scanRegistrations(rows *sql.Rows, err error) ([]Registration, error) {
	return collect(rows, err, func(r *sql.Rows) (Registration, error) { return scanRegistration(r) })
}

// CreateRegistration registers workerID for peer and returns the new
// registration with its token. The token is shown to the operator once
// (for the worker's peers file) and only its hash is stored.
//
// Errors: an unknown project or cache is ErrNotFound; an existing
// registration of the pair, or a worker ID that belongs to a team worker,
// is ErrConflict.
func (db *DB) CreateRegistration(ctx context.Context, peer Peer, workerID string, settings WorkerSettings) (Registration, string, error) {
	peer, err := canonicalPeer(peer)
	if err != nil {
		return Registration{}, "", err
	}
	workerID, err = canonicalUUID("worker ID", workerID)
	if err != nil {
		return Registration{}, "", err
	}
	if err := settings.validate(); err != nil {
		return Registration{}, "", err
	}
	token, hash, err := newWorkerToken()
	if err != nil {
		return Registration{}, "", err
	}
	r := Registration{
		Peer: peer, WorkerID: workerID, TokenHash: hash,
		WorkerSettings: settings, CreatedAt: fromMillis(nowMillis()),
	}
	err = db.inTx(ctx, func(tx *sql.Tx) error {
		if err := peerMustExist(ctx, tx, peer); err != nil {
			return err
		}
		if err := claimWorkerID(ctx, tx, workerID, ownerRegistration); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO worker_registrations (peer_kind, peer_id, worker_id, token_hash, url,
			     enable_fetch, enable_eval, enable_build, created_at)
			 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			peer.Kind, peer.ID, workerID, hash, settings.nullableURL(),
			settings.EnableFetch, settings.EnableEval, settings.EnableBuild, r.CreatedAt.UnixMilli())
		switch constraintOf(err) {
		case uniqueViolation:
			return conflict("worker %s is already registered by %s %s", workerID, peer.Kind, peer.ID)
		case foreignKeyViolation: // a team worker took the ID concurrently
			return workerIDTaken(workerID, ownerTeam)
		}
		return err
	})
	if err != nil {
		return Registration{}, "", err
	}
	return r, token, nil
}

func peerMustExist(ctx context.Context, q querier, peer Peer) error {
	switch peer.Kind {
	case PeerProject:
		return mustExist(ctx, q, `SELECT 1 FROM projects WHERE id = $1`, peer.ID, "project %s")
	case PeerCache:
		return mustExist(ctx, q, `SELECT 1 FROM caches WHERE id = $1`, peer.ID, "cache %s")
	}
	return nil // proxies have no table yet
}

// Registration returns one registration.
func (db *DB) Registration(ctx context.Context, peer Peer, workerID string) (Registration, error) {
	peer, err := canonicalPeer(peer)
	if err != nil {
		return Registration{}, err
	}
	workerID, err = canonicalUUID("worker ID", workerID)
	if err != nil {
		return Registration{}, err
	}
	r, err := scanRegistration(db.sql.QueryRowContext(ctx,
		`SELECT `+registrationColumns+` FROM worker_registrations
		 WHERE peer_kind = $1 AND peer_id = $2 AND worker_id = $3`, peer.Kind, peer.ID, workerID))
	if errors.Is(err, sql.ErrNoRows) {
		return Registration{}, notFound("registration of worker %s by %s %s", workerID, peer.Kind, peer.ID)
	}
	return r, err
}

// ListPeerRegistrations returns the workers a peer registered, by worker ID.
func (db *DB) ListPeerRegistrations(ctx context.Context, peer Peer) ([]Registration, error) {
	peer, err := canonicalPeer(peer)
	if err != nil {
		return nil, err
	}
	return scanRegistrations(db.sql.QueryContext(ctx,
		`SELECT `+registrationColumns+` FROM worker_registrations
		 WHERE peer_kind = $1 AND peer_id = $2 ORDER BY worker_id`, peer.Kind, peer.ID))
}

// RegistrationsOfWorker returns every registration of a worker ID, by
// peer: the peers the authority challenges on connect.
func (db *DB) RegistrationsOfWorker(ctx context.Context, workerID string) ([]Registration, error) {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return nil, err
	}
	return registrationsOfWorker(ctx, db.sql, workerID)
}

func registrationsOfWorker(ctx context.Context, q querier, workerID string) ([]Registration, error) {
	return scanRegistrations(q.QueryContext(ctx,
		`SELECT `+registrationColumns+` FROM worker_registrations
		 WHERE worker_id = $1 ORDER BY peer_kind, peer_id`, workerID))
}

// UpdateRegistration replaces the URL and job kinds of a registration.
// Removing the URL drops the sealed dial token: the server no longer dials.
func (db *DB) UpdateRegistration(ctx context.Context, peer Peer, workerID string, settings WorkerSettings) error {
	peer, err := canonicalPeer(peer)
	if err != nil {
		return err
	}
	workerID, err = canonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	if err := settings.validate(); err != nil {
		return err
	}
	res, err := db.exec(ctx,
		`UPDATE worker_registrations
		 SET url = $1, enable_fetch = $2, enable_eval = $3, enable_build = $4,
		     dial_token_sealed = CASE WHEN $8 THEN dial_token_sealed ELSE NULL END
		 WHERE peer_kind = $5 AND peer_id = $6 AND worker_id = $7`,
		settings.nullableURL(), settings.EnableFetch, settings.EnableEval, settings.EnableBuild,
		peer.Kind, peer.ID, workerID, settings.URL != "")
	return affectedOne(res, err, "registration of worker %s by %s %s", workerID, peer.Kind, peer.ID)
}

// RotateRegistrationToken replaces a registration's token and returns the
// new one, shown once. The old token stops working at once, and its sealed
// dial copy is dropped until the server seals the new one.
func (db *DB) RotateRegistrationToken(ctx context.Context, peer Peer, workerID string) (string, error) {
	peer, err := canonicalPeer(peer)
	if err != nil {
		return "", err
	}
	workerID, err = canonicalUUID("worker ID", workerID)
	if err != nil {
		return "", err
	}
	token, hash, err := newWorkerToken()
	if err != nil {
		return "", err
	}
	res, err := db.exec(ctx,
		`UPDATE worker_registrations SET token_hash = $1, dial_token_sealed = NULL
		 WHERE peer_kind = $2 AND peer_id = $3 AND worker_id = $4`, hash, peer.Kind, peer.ID, workerID)
	if err := affectedOne(res, err, "registration of worker %s by %s %s", workerID, peer.Kind, peer.ID); err != nil {
		return "", err
	}
	return token, nil
}

// DeleteRegistration removes one registration.
func (db *DB) DeleteRegistration(ctx context.Context, peer Peer, workerID string) error {
	peer, err := canonicalPeer(peer)
	if err != nil {
		return err
	}
	workerID, err = canonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	res, err := db.exec(ctx,
		`DELETE FROM worker_registrations WHERE peer_kind = $1 AND peer_id = $2 AND worker_id = $3`,
		peer.Kind, peer.ID, workerID)
	return affectedOne(res, err, "registration of worker %s by %s %s", workerID, peer.Kind, peer.ID)
}

// deletePeerRegistrations removes every registration by a deleted peer.
// The worker_ids claims stay; a later claim of the other kind takes them over.
func deletePeerRegistrations(ctx context.Context, tx *sql.Tx, peer Peer) error {
	_, err := tx.ExecContext(ctx,
		`DELETE FROM worker_registrations WHERE peer_kind = $1 AND peer_id = $2`, peer.Kind, peer.ID)
	return err
}
