package storage

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
)

// The server seals the token of a registration or team worker with a URL
// (see package sealbox) and stores the sealed bytes here, so it can present
// the token when it dials the worker. Storage only keeps the bytes: it
// never sees the key.

// SetRegistrationDialToken stores the sealed token of a registration the
// server dials. A registration without a URL is ErrInvalid; a missing one
// ErrNotFound.
func (db *DB) SetRegistrationDialToken(ctx context.Context, peer Peer, workerID string, sealed []byte) error {
	peer, err := canonicalPeer(peer)
	if err != nil {
		return err
	}
	workerID, err = canonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	if len(sealed) == 0 {
		return invalid("empty sealed dial token")
	}
	what := fmt.Sprintf("registration of worker %s by %s %s", workerID, peer.Kind, peer.ID)
	return setDialToken(ctx, db,
		`SELECT url FROM worker_registrations WHERE peer_kind = $1 AND peer_id = $2 AND worker_id = $3`,
		`UPDATE worker_registrations SET dial_token_sealed = $4
		 WHERE peer_kind = $1 AND peer_id = $2 AND worker_id = $3`,
		what, peer.Kind, peer.ID, workerID, encodeSealed(sealed))
}

// SetTeamWorkerDialToken stores the sealed token of a team worker the
// server dials; errors as SetRegistrationDialToken.
func (db *DB) SetTeamWorkerDialToken(ctx context.Context, workerID string, sealed []byte) error {
	workerID, err := canonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	if len(sealed) == 0 {
		return invalid("empty sealed dial token")
	}
	return setDialToken(ctx, db,
		`SELECT url FROM team_workers WHERE worker_id = $1`,
		`UPDATE team_workers SET dial_token_sealed = $2 WHERE worker_id = $1`,
		"team worker "+workerID, workerID, encodeSealed(sealed))
}

// setDialToken checks that the row exists and has a URL, then stores the
// sealed token; args are the key columns followed by the sealed text.
func setDialToken(ctx context.Context, db *DB, selectURL, update, what string, args ...any) error {
	keys := args[:len(args)-1]
	return db.inTx(ctx, func(tx *sql.Tx) error {
		var url sql.NullString
		err := tx.QueryRowContext(ctx, selectURL, keys...).Scan(&url)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("%s", what)
		}
		if err != nil {
			return err
		}
		if !url.Valid {
			return invalid("%s has no URL: the server does not dial it", what)
		}
		_, err = tx.ExecContext(ctx, update, args...)
		return err
	})
}

// Sealed bytes are stored as standard base64 text, one column type on both
// engines.
func encodeSealed(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func decodeSealed(s sql.NullString) ([]byte, error) {
	if !s.Valid {
		return nil, nil
	}
	b, err := base64.StdEncoding.DecodeString(s.String)
	if err != nil {
		return nil, fmt.Errorf("stored sealed value: %w", err)
	}
	return b, nil
}
