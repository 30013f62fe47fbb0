package storage

import (
	"context"
	"database/sql"
	"net/url"

	"gradient.dev/gradient/secret"
)

// PeerKind is what registered a worker: a project, a cache or a proxy.
type PeerKind string

const (
	PeerProject PeerKind = "project"
	PeerCache   PeerKind = "cache"
	PeerProxy   PeerKind = "proxy"
)

// Peer identifies the registering side of a worker registration.
type Peer struct {
	Kind PeerKind
	ID   string // UUID of the project, cache or proxy
}

// WorkerSettings are the operator's choices for one registration or team
// worker. The zero value disables every job kind: start from
// DefaultWorkerSettings, which enables them all, as the schema does.
type WorkerSettings struct {
	// URL is where the server dials the worker (ws:// or wss://);
	// empty when the worker dials the server.
	URL         string
	EnableFetch bool
	EnableEval  bool
	EnableBuild bool
}

// DefaultWorkerSettings enables fetch, eval and build for a worker that
// dials the server.
func DefaultWorkerSettings() WorkerSettings {
	return WorkerSettings{EnableFetch: true, EnableEval: true, EnableBuild: true}
}

func (s WorkerSettings) validate() error {
	if s.URL == "" {
		return nil
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return invalid("worker URL %q: want ws://host/... or wss://host/...", s.URL)
	}
	return nil
}

// nullableURL stores "" as NULL so "has a URL" is a plain IS NOT NULL.
func (s WorkerSettings) nullableURL() sql.NullString {
	return sql.NullString{String: s.URL, Valid: s.URL != ""}
}

// canonicalPeer validates p and lowercases its ID.
func canonicalPeer(p Peer) (Peer, error) {
	switch p.Kind {
	case PeerProject, PeerCache, PeerProxy:
	default:
		return Peer{}, invalid("peer kind %q: want project, cache or proxy", p.Kind)
	}
	id, err := canonicalUUID("peer ID", p.ID)
	return Peer{Kind: p.Kind, ID: id}, err
}

// newWorkerToken returns a fresh token and the hash to store. The token
// is handed to the caller once and never stored.
func newWorkerToken() (token, hash string, err error) {
	if token, err = secret.Generate(); err != nil {
		return "", "", err
	}
	if hash, err = secret.Hash(token); err != nil {
		return "", "", err
	}
	return token, hash, nil
}

// Owners of a worker ID in worker_ids.
const (
	ownerRegistration = "registration"
	ownerTeam         = "team"
)

// claimWorkerID records that owner ("registration" or "team") holds
// workerID, inside tx. A worker ID held by the other kind is ErrConflict.
// A claim left behind by deleted credentials is taken over.
func claimWorkerID(ctx context.Context, tx *sql.Tx, workerID, owner string) error {
	_, err := tx.ExecContext(ctx,
		`DELETE FROM worker_ids
		 WHERE worker_id = $1 AND owner <> $2
		   AND NOT EXISTS (SELECT 1 FROM worker_registrations WHERE worker_id = $1)
		   AND NOT EXISTS (SELECT 1 FROM team_workers WHERE worker_id = $1)`,
		workerID, owner)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx,
		`INSERT INTO worker_ids (worker_id, owner) VALUES ($1, $2) ON CONFLICT (worker_id) DO NOTHING`,
		workerID, owner)
	if err != nil {
		return err
	}
	var current string
	if err := tx.QueryRowContext(ctx,
		`SELECT owner FROM worker_ids WHERE worker_id = $1`, workerID).Scan(&current); err != nil {
		return err
	}
	if current != owner {
		return workerIDTaken(workerID, current)
	}
	return nil
}

func workerIDTaken(workerID, owner string) error {
	holder := "a team worker"
	if owner == ownerRegistration {
		holder = "worker registrations"
	}
	return conflict("worker ID %s belongs to %s; Gradient.CI worker IDs belong to one registration or team worker only", workerID, holder)
}

// readTx runs fn in a read-only transaction that sees one snapshot.
func (db *DB) readTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := db.sql.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return err
	}
	defer tx.Rollback() // read-only: nothing to keep; a no-op after Commit
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
