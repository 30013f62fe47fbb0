package storage

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"
)

// DeployKey is a project's SSH deploy key: the server seals the private
// half (package sealbox) and hands it to the worker that fetches the
// project's repository (Credential SshKey, docs/protocol/jobs.md §5.2). Storage keeps
// only the sealed bytes.
type DeployKey struct {
	ProjectID     string
	PublicKey     string // OpenSSH authorized_keys line
	PrivateSealed []byte
	CreatedAt     time.Time
}

// SetDeployKey stores the project's deploy key, replacing any earlier
// one. An unknown project is ErrNotFound.
func (db *DB) SetDeployKey(ctx context.Context, projectID, publicKey string, privateSealed []byte) error {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(publicKey, "ssh-") || len(privateSealed) == 0 {
		return invalid("a deploy key needs an OpenSSH public key and the sealed private key")
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		if err := mustExist(ctx, tx, `SELECT 1 FROM projects WHERE id = $1`, projectID, "project %s"); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO project_deploy_keys (project_id, public_key, private_sealed, created_at)
			VALUES ($1, $2, $3, $4)
			ON CONFLICT (project_id) DO UPDATE SET public_key = excluded.public_key,
				private_sealed = excluded.private_sealed, created_at = excluded.created_at`,
			projectID, publicKey, encodeSealed(privateSealed), nowMillis())
		return err
	})
}

// DeployKey returns the project's deploy key; ErrNotFound when it has none.
func (db *DB) DeployKey(ctx context.Context, projectID string) (DeployKey, error) {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return DeployKey{}, err
	}
	k := DeployKey{ProjectID: projectID}
	var sealed sql.NullString
	var created int64
	err = db.sql.QueryRowContext(ctx, `SELECT public_key, private_sealed, created_at
		FROM project_deploy_keys WHERE project_id = $1`, projectID).Scan(&k.PublicKey, &sealed, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return DeployKey{}, notFound("deploy key of project %s", projectID)
	}
	if err != nil {
		return DeployKey{}, err
	}
	k.CreatedAt = fromMillis(created)
	k.PrivateSealed, err = decodeSealed(sealed)
	return k, err
}

// DeleteDeployKey removes the project's deploy key; ErrNotFound when it
// has none.
func (db *DB) DeleteDeployKey(ctx context.Context, projectID string) error {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return err
	}
	res, err := db.exec(ctx, `DELETE FROM project_deploy_keys WHERE project_id = $1`, projectID)
	return affectedOne(res, err, "deploy key of project %s", projectID)
}
