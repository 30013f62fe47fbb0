package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Forge links, webhook deliveries and the commit-status outbox
// (migrations/0015_forges.*.sql). The outbox rows are written by
// triggers inside the transactions that queue and end evaluations, so no
// state change can commit without its status; the poster
// (server/forgestatus) reads them with DueForgeStatuses.

// ForgeTrust decides which pull requests run without an approval.
type ForgeTrust string

const (
	ForgeTrustApprove ForgeTrust = "approve" // pull requests from forks wait for an approval
	ForgeTrustAll     ForgeTrust = "all"     // every pull request runs
	ForgeTrustNone    ForgeTrust = "none"    // no pull request runs
)

// Valid reports a known trust policy.
func (t ForgeTrust) Valid() bool {
	return t == ForgeTrustApprove || t == ForgeTrustAll || t == ForgeTrustNone
}

// ForgeLink is a project's link to its forge. Storage keeps the secrets
// only sealed (package sealbox, by the server).
type ForgeLink struct {
	ProjectID  string
	Kind       string // github, gitea, gitlab
	APIURL     string
	Repository string
	// AppID is the GitHub App's ID when CredentialSealed holds the
	// App's private key; 0 when it holds a token.
	AppID               int64
	CredentialSealed    []byte
	WebhookSecretSealed []byte // nil until generated
	Trust               ForgeTrust
	PerBuildStatuses    bool
	StatusContext       string
	CreatedAt           time.Time
	UpdatedAt           time.Time
}

const forgeLinkColumns = `project_id, kind, api_url, repository, app_id, credential_sealed,
	webhook_secret_sealed, trust, per_build_statuses, status_context, created_at, updated_at`

func scanForgeLink(row interface{ Scan(...any) error }) (ForgeLink, error) {
	var l ForgeLink
	var app sql.NullInt64
	var cred, hook sql.NullString
	var created, updated int64
	err := row.Scan(&l.ProjectID, &l.Kind, &l.APIURL, &l.Repository, &app, &cred, &hook, &l.Trust,
		&l.PerBuildStatuses, &l.StatusContext, &created, &updated)
	if err != nil {
		return ForgeLink{}, err
	}
	l.AppID = app.Int64
	l.CreatedAt, l.UpdatedAt = fromMillis(created), fromMillis(updated)
	if l.CredentialSealed, err = decodeSealed(cred); err != nil {
		return ForgeLink{}, err
	}
	l.WebhookSecretSealed, err = decodeSealed(hook)
	return l, err
}

// SetForgeLink stores the project's forge link, replacing an earlier one
// but keeping its webhook secret. An unknown project is ErrNotFound.
func (db *DB) SetForgeLink(ctx context.Context, l ForgeLink) error {
	projectID, err := canonicalUUID("project ID", l.ProjectID)
	if err != nil {
		return err
	}
	switch {
	case l.Kind != "github" && l.Kind != "gitea" && l.Kind != "gitlab":
		return invalid("unknown forge kind %q", l.Kind)
	case strings.TrimSpace(l.APIURL) == "" || strings.TrimSpace(l.Repository) == "":
		return invalid("a forge link needs an API URL and a repository")
	case len(l.CredentialSealed) == 0:
		return invalid("a forge link needs a sealed credential")
	case l.AppID < 0:
		return invalid("a GitHub App ID is positive")
	case !l.Trust.Valid():
		return invalid("unknown trust policy %q (approve, all or none)", l.Trust)
	case l.StatusContext == "":
		return invalid("a forge link needs a status context")
	}
	var app any
	if l.AppID > 0 {
		app = l.AppID
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		if err := mustExist(ctx, tx, `SELECT 1 FROM projects WHERE id = $1`, projectID, "project %s"); err != nil {
			return err
		}
		now := nowMillis()
		_, err := tx.ExecContext(ctx, `INSERT INTO project_forges (project_id, kind, api_url, repository, app_id,
				credential_sealed, trust, per_build_statuses, status_context, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)
			ON CONFLICT (project_id) DO UPDATE SET kind = excluded.kind, api_url = excluded.api_url,
				repository = excluded.repository, app_id = excluded.app_id,
				credential_sealed = excluded.credential_sealed, trust = excluded.trust,
				per_build_statuses = excluded.per_build_statuses, status_context = excluded.status_context,
				updated_at = excluded.updated_at`,
			projectID, l.Kind, l.APIURL, l.Repository, app, encodeSealed(l.CredentialSealed), string(l.Trust),
			l.PerBuildStatuses, l.StatusContext, now)
		return err
	})
}

// ForgeLink returns the project's forge link; ErrNotFound when it has none.
func (db *DB) ForgeLink(ctx context.Context, projectID string) (ForgeLink, error) {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return ForgeLink{}, err
	}
	l, err := scanForgeLink(db.sql.QueryRowContext(ctx,
		`SELECT `+forgeLinkColumns+` FROM project_forges WHERE project_id = $1`, projectID))
	if errors.Is(err, sql.ErrNoRows) {
		return ForgeLink{}, notFound("forge link of project %s", projectID)
	}
	return l, err
}

// DeleteForgeLink removes the project's forge link with its webhook
// secret and the statuses not posted yet; ErrNotFound when it has none.
func (db *DB) DeleteForgeLink(ctx context.Context, projectID string) error {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return err
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM project_forges WHERE project_id = $1`, projectID)
		if err := affectedOne(res, err, "forge link of project %s", projectID); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM forge_statuses WHERE project_id = $1`, projectID)
		return err
	})
}

// SetForgeWebhookSecret stores the project's sealed webhook secret,
// replacing the earlier one; ErrNotFound without a forge link.
func (db *DB) SetForgeWebhookSecret(ctx context.Context, projectID string, sealed []byte) error {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return err
	}
	if len(sealed) == 0 {
		return invalid("the sealed webhook secret is empty")
	}
	res, err := db.exec(ctx, `UPDATE project_forges SET webhook_secret_sealed = $2, updated_at = $3 WHERE project_id = $1`,
		projectID, encodeSealed(sealed), nowMillis())
	return affectedOne(res, err, "forge link of project %s", projectID)
}

// ---- deliveries ----

// MaxDeliveryIDLength bounds a stored delivery ID (forges send UUIDs).
const MaxDeliveryIDLength = 128

// RecordForgeDelivery records a webhook delivery of the project and
// reports whether it is new; a delivery ID seen before is not.
func (db *DB) RecordForgeDelivery(ctx context.Context, projectID, deliveryID string) (bool, error) {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return false, err
	}
	if deliveryID == "" || len(deliveryID) > MaxDeliveryIDLength {
		return false, invalid("a delivery ID has 1 to %d bytes", MaxDeliveryIDLength)
	}
	res, err := db.exec(ctx, `INSERT INTO forge_deliveries (project_id, delivery_id, received_at)
		VALUES ($1, $2, $3) ON CONFLICT (project_id, delivery_id) DO NOTHING`, projectID, deliveryID, nowMillis())
	if constraintOf(err) == foreignKeyViolation {
		return false, notFound("project %s", projectID)
	}
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// ForgetForgeDelivery forgets one delivery, so the forge's retry of a
// delivery that failed on our side is acted on.
func (db *DB) ForgetForgeDelivery(ctx context.Context, projectID, deliveryID string) error {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return err
	}
	_, err = db.exec(ctx, `DELETE FROM forge_deliveries WHERE project_id = $1 AND delivery_id = $2`, projectID, deliveryID)
	return err
}

// PruneForgeDeliveries forgets deliveries received before t and returns
// how many. Forges redeliver within hours, so a week is plenty.
func (db *DB) PruneForgeDeliveries(ctx context.Context, before time.Time) (int, error) {
	res, err := db.exec(ctx, `DELETE FROM forge_deliveries WHERE received_at < $1`, before.UnixMilli())
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// ---- the status outbox ----

// ForgeStatus is one outbox row: the newest state of a commit's context.
type ForgeStatus struct {
	ProjectID     string
	Commit        string
	Context       string
	EvaluationID  string
	State         string // pending, success, failure, error
	Description   string
	Version       int64 // bumped on every change
	PostedVersion int64 // the newest version posted
	Attempts      int   // failed posts of this version
	NextAttemptAt time.Time
	LastError     string
	UpdatedAt     time.Time
	// ClaimedBy is the poster that claimed the row (ClaimDueForgeStatuses);
	// posting it or deferring it ends that claim.
	ClaimedBy string
}

const forgeStatusColumns = `project_id, commit_sha, context, evaluation_id, state, description, version,
	posted_version, attempts, next_attempt_at, last_error, updated_at`

func scanForgeStatus(row interface{ Scan(...any) error }) (ForgeStatus, error) {
	var s ForgeStatus
	var next, updated int64
	var lastErr sql.NullString
	err := row.Scan(&s.ProjectID, &s.Commit, &s.Context, &s.EvaluationID, &s.State, &s.Description, &s.Version,
		&s.PostedVersion, &s.Attempts, &next, &lastErr, &updated)
	s.NextAttemptAt, s.UpdatedAt, s.LastError = fromMillis(next), fromMillis(updated), lastErr.String
	return s, err
}

// DueForgeStatuses returns at most limit outbox rows with a version not
// posted yet whose next attempt is due at now, oldest due first.
func (db *DB) DueForgeStatuses(ctx context.Context, now time.Time, limit int) ([]ForgeStatus, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.sql.QueryContext(ctx, `SELECT `+forgeStatusColumns+` FROM forge_statuses
		WHERE version > posted_version AND next_attempt_at <= $1
		ORDER BY next_attempt_at, updated_at LIMIT `+fmt.Sprint(limit), now.UnixMilli())
	return collect(rows, err, func(r *sql.Rows) (ForgeStatus, error) { return scanForgeStatus(r) })
}

// ClaimDueForgeStatuses is DueForgeStatuses for one of several posters
// (server instances; owner is the instance's ID): it claims the rows it
// returns for owner until claimedUntil, and skips rows that a live
// instance's unexpired claim holds, so each status is posted once (README
// "Several instances"). An owner without a live server_instances row
// claims nothing that holds: it must be the only poster. On PostgreSQL
// SKIP LOCKED lets two instances claim side by side without waiting on
// each other's rows; the outer claimed_until check makes a row that was
// claimed meanwhile drop out.
func (db *DB) ClaimDueForgeStatuses(ctx context.Context, owner string, now, claimedUntil time.Time, limit int) ([]ForgeStatus, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: a claim needs an owner", ErrInvalid)
	}
	if limit <= 0 {
		limit = 100
	}
	skipLocked := ""
	if db.engine == EnginePostgres {
		skipLocked = " FOR UPDATE SKIP LOCKED"
	}
	// A claim holds while it lasts and its owner is a live server
	// instance: a dead instance's claims end with its lease.
	claimable := `(claimed_until <= $2 OR claimed_by IS NULL OR claimed_by NOT IN
		(SELECT id FROM server_instances WHERE lease_until > ` + db.dbNowMillis() + `))`
	var out []ForgeStatus
	err := db.inTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `UPDATE forge_statuses SET claimed_by = $1, claimed_until = $3
			WHERE version > posted_version AND next_attempt_at <= $2 AND `+claimable+`
			AND (project_id, commit_sha, context) IN (SELECT project_id, commit_sha, context FROM forge_statuses
				WHERE version > posted_version AND next_attempt_at <= $2 AND `+claimable+`
				ORDER BY next_attempt_at, updated_at LIMIT `+fmt.Sprint(limit)+skipLocked+`)
			RETURNING `+forgeStatusColumns, owner, now.UnixMilli(), claimedUntil.UnixMilli())
		out, err = collect(rows, err, func(r *sql.Rows) (ForgeStatus, error) { return scanForgeStatus(r) })
		return err
	})
	for i := range out {
		out[i].ClaimedBy = owner
	}
	// RETURNING keeps no order: oldest due first, as DueForgeStatuses.
	slices.SortFunc(out, func(a, b ForgeStatus) int {
		return cmp.Or(a.NextAttemptAt.Compare(b.NextAttemptAt), a.UpdatedAt.Compare(b.UpdatedAt))
	})
	return out, err
}

// NextForgeStatusAt is when the earliest unposted row is due (or its
// claim ends, when a poster holds it); zero when none is waiting.
func (db *DB) NextForgeStatusAt(ctx context.Context) (time.Time, error) {
	var next sql.NullInt64
	err := db.sql.QueryRowContext(ctx, `SELECT MIN(CASE WHEN claimed_until > next_attempt_at
		THEN claimed_until ELSE next_attempt_at END) FROM forge_statuses
		WHERE version > posted_version`).Scan(&next)
	if err != nil || !next.Valid {
		return time.Time{}, err
	}
	return fromMillis(next.Int64), nil
}

// ForgeStatusDepth counts the outbox rows not posted yet.
func (db *DB) ForgeStatusDepth(ctx context.Context) (int, error) {
	var n int
	err := db.sql.QueryRowContext(ctx, `SELECT COUNT(*) FROM forge_statuses WHERE version > posted_version`).Scan(&n)
	return n, err
}

// ForgeStatuses lists a project's outbox rows, by commit and context.
func (db *DB) ForgeStatuses(ctx context.Context, projectID string) ([]ForgeStatus, error) {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return nil, err
	}
	rows, err := db.sql.QueryContext(ctx, `SELECT `+forgeStatusColumns+` FROM forge_statuses
		WHERE project_id = $1 ORDER BY commit_sha, context`, projectID)
	return collect(rows, err, func(r *sql.Rows) (ForgeStatus, error) { return scanForgeStatus(r) })
}

// MarkForgeStatusPosted records that version s.Version of the row was
// posted. It never lowers posted_version, so a slow post of an older
// version does not mark a newer one done; it reports whether the row's
// newest version is now posted.
func (db *DB) MarkForgeStatusPosted(ctx context.Context, s ForgeStatus) (bool, error) {
	var current int64
	err := db.sql.QueryRowContext(ctx, `UPDATE forge_statuses
		SET posted_version = CASE WHEN posted_version < $4 THEN $4 ELSE posted_version END,
		    attempts = CASE WHEN version = $4 THEN 0 ELSE attempts END,
		    last_error = CASE WHEN version = $4 THEN NULL ELSE last_error END,
		    claimed_until = CASE WHEN claimed_by = $5 THEN 0 ELSE claimed_until END
		WHERE project_id = $1 AND commit_sha = $2 AND context = $3 RETURNING version`,
		s.ProjectID, s.Commit, s.Context, s.Version, s.ClaimedBy).Scan(&current)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil // the link was removed meanwhile
	}
	return current == s.Version, err
}

// DeferForgeStatus schedules the next attempt of version s.Version after
// a failed post; a row changed since (a newer version) is left as it is,
// due at once.
func (db *DB) DeferForgeStatus(ctx context.Context, s ForgeStatus, next time.Time, reason string) error {
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	_, err := db.exec(ctx, `UPDATE forge_statuses SET attempts = attempts + 1, next_attempt_at = $5, last_error = $6
		WHERE project_id = $1 AND commit_sha = $2 AND context = $3 AND version = $4`,
		s.ProjectID, s.Commit, s.Context, s.Version, next.UnixMilli(), reason)
	if err != nil || s.ClaimedBy == "" {
		return err
	}
	// The claim ends whether or not the row changed meanwhile: a newer
	// version is due at once.
	_, err = db.exec(ctx, `UPDATE forge_statuses SET claimed_until = 0
		WHERE project_id = $1 AND commit_sha = $2 AND context = $3 AND claimed_by = $4`,
		s.ProjectID, s.Commit, s.Context, s.ClaimedBy)
	return err
}

// PruneForgeStatuses drops posted rows last changed before t (the forge
// keeps them; the outbox only needs the unposted ones and recent ones for
// coalescing) and returns how many.
func (db *DB) PruneForgeStatuses(ctx context.Context, before time.Time) (int, error) {
	res, err := db.exec(ctx, `DELETE FROM forge_statuses WHERE version <= posted_version AND updated_at < $1`,
		before.UnixMilli())
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
