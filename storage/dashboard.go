package storage

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"gradient.dev/gradient/secret"
)

// Scoped API tokens, the dashboard's sessions and public projects
// (migrations/0016_dashboard.sql).

// TokenScope is what an API token or a dashboard session may do.
type TokenScope string

const (
	// ScopeRead may read (GET) everything the admin API shows.
	ScopeRead TokenScope = "read"
	// ScopeAdmin may do what the admin token does.
	ScopeAdmin TokenScope = "admin"
)

// Valid reports whether s is a known scope.
func (s TokenScope) Valid() bool { return s == ScopeRead || s == ScopeAdmin }

// APITokenPrefix starts every scoped API token as users see it, so the
// admin API tells one from the admin token without an argon2id check.
const APITokenPrefix = "gradt_"

// APIToken is a scoped API token; only the SHA-256 of its secret is kept.
type APIToken struct {
	ID        string
	Name      string
	Scope     TokenScope
	CreatedAt time.Time
}

func secretDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// CreateAPIToken makes a token and returns it with its text
// (APITokenPrefix + 384 random bits), shown once and never stored.
func (db *DB) CreateAPIToken(ctx context.Context, name string, scope TokenScope) (APIToken, string, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 200 {
		return APIToken{}, "", invalid("token name: give 1 to 200 characters")
	}
	if !scope.Valid() {
		return APIToken{}, "", invalid("token scope %q: want read or admin", scope)
	}
	token, err := secret.Generate()
	if err != nil {
		return APIToken{}, "", err
	}
	t := APIToken{ID: NewID(), Name: name, Scope: scope, CreatedAt: fromMillis(nowMillis())}
	if _, err := db.exec(ctx,
		`INSERT INTO api_tokens (id, name, scope, token_digest, created_at) VALUES ($1, $2, $3, $4, $5)`,
		t.ID, t.Name, string(t.Scope), secretDigest(token), t.CreatedAt.UnixMilli()); err != nil {
		return APIToken{}, "", err
	}
	return t, APITokenPrefix + token, nil
}

// APITokenByText returns the token whose text (with its prefix) is text,
// or ErrNotFound: one SHA-256 and one indexed lookup, right or wrong.
func (db *DB) APITokenByText(ctx context.Context, text string) (APIToken, error) {
	token, ok := strings.CutPrefix(text, APITokenPrefix)
	if !ok || token == "" {
		return APIToken{}, notFound("API token")
	}
	digest := secretDigest(token)
	var t APIToken
	var stored, scope string
	var created int64
	err := db.sql.QueryRowContext(ctx,
		`SELECT id, name, scope, token_digest, created_at FROM api_tokens WHERE token_digest = $1`, digest).
		Scan(&t.ID, &t.Name, &scope, &stored, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return APIToken{}, notFound("API token")
	}
	if err != nil {
		return APIToken{}, err
	}
	if subtle.ConstantTimeCompare([]byte(stored), []byte(digest)) != 1 {
		return APIToken{}, notFound("API token")
	}
	t.Scope, t.CreatedAt = TokenScope(scope), fromMillis(created)
	return t, nil
}

// APITokens lists the API tokens, oldest first.
func (db *DB) APITokens(ctx context.Context) ([]APIToken, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT id, name, scope, created_at FROM api_tokens ORDER BY created_at, id`)
	return collect(rows, err, func(r *sql.Rows) (APIToken, error) {
		var t APIToken
		var scope string
		var created int64
		err := r.Scan(&t.ID, &t.Name, &scope, &created)
		t.Scope, t.CreatedAt = TokenScope(scope), fromMillis(created)
		return t, err
	})
}

// DeleteAPIToken revokes a token and ends the dashboard sessions it
// opened.
func (db *DB) DeleteAPIToken(ctx context.Context, id string) error {
	id, err := canonicalUUID("token ID", id)
	if err != nil {
		return err
	}
	res, err := db.exec(ctx, `DELETE FROM api_tokens WHERE id = $1`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return notFound("API token %s", id)
	}
	return nil // its sessions go with it (ON DELETE CASCADE)
}

// DashboardSession is a logged-in browser.
type DashboardSession struct {
	Scope     TokenScope
	TokenID   string // "" for the admin token
	ExpiresAt time.Time
}

// CreateDashboardSession opens a session for ttl and returns its ID, a
// random 256-bit secret the browser keeps in a cookie; only its SHA-256
// is stored. Expired sessions are removed on the way.
func (db *DB) CreateDashboardSession(ctx context.Context, scope TokenScope, tokenID string, ttl time.Duration) (string, DashboardSession, error) {
	if !scope.Valid() {
		return "", DashboardSession{}, invalid("session scope %q", scope)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", DashboardSession{}, err
	}
	id := base64.RawURLEncoding.EncodeToString(raw)
	now := nowMillis()
	s := DashboardSession{Scope: scope, TokenID: tokenID, ExpiresAt: fromMillis(now + ttl.Milliseconds())}
	var token any
	if tokenID != "" {
		token = tokenID
	}
	if _, err := db.exec(ctx, `DELETE FROM dashboard_sessions WHERE expires_at < $1`, now); err != nil {
		return "", DashboardSession{}, err
	}
	_, err := db.exec(ctx,
		`INSERT INTO dashboard_sessions (digest, scope, token_id, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)`,
		secretDigest(id), string(scope), token, now, s.ExpiresAt.UnixMilli())
	if constraintOf(err) == foreignKeyViolation {
		return "", DashboardSession{}, notFound("API token %s", tokenID)
	}
	if err != nil {
		return "", DashboardSession{}, err
	}
	return id, s, nil
}

// DashboardSessionByID returns the unexpired session with id, or
// ErrNotFound.
func (db *DB) DashboardSessionByID(ctx context.Context, id string) (DashboardSession, error) {
	if id == "" || len(id) > 100 {
		return DashboardSession{}, notFound("session")
	}
	digest := secretDigest(id)
	var s DashboardSession
	var stored, scope string
	var token sql.NullString
	var expires int64
	err := db.sql.QueryRowContext(ctx,
		`SELECT digest, scope, token_id, expires_at FROM dashboard_sessions WHERE digest = $1`, digest).
		Scan(&stored, &scope, &token, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return DashboardSession{}, notFound("session")
	}
	if err != nil {
		return DashboardSession{}, err
	}
	if subtle.ConstantTimeCompare([]byte(stored), []byte(digest)) != 1 || expires <= nowMillis() {
		return DashboardSession{}, notFound("session")
	}
	s.Scope, s.TokenID, s.ExpiresAt = TokenScope(scope), token.String, fromMillis(expires)
	return s, nil
}

// DeleteDashboardSession ends a session (logout); an unknown one is no
// error.
func (db *DB) DeleteDashboardSession(ctx context.Context, id string) error {
	_, err := db.exec(ctx, `DELETE FROM dashboard_sessions WHERE digest = $1`, secretDigest(id))
	return err
}

// SetProjectPublic makes a project's evaluations, builds and logs
// readable without credentials (or not).
func (db *DB) SetProjectPublic(ctx context.Context, projectID string, public bool) error {
	id, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return err
	}
	if !public {
		_, err = db.exec(ctx, `DELETE FROM public_projects WHERE project_id = $1`, id)
		return err
	}
	_, err = db.exec(ctx, `INSERT INTO public_projects (project_id) VALUES ($1) ON CONFLICT DO NOTHING`, id)
	if constraintOf(err) == foreignKeyViolation {
		return notFound("project %s", id)
	}
	return err
}

// ProjectPublic reports whether a project is public.
func (db *DB) ProjectPublic(ctx context.Context, projectID string) (bool, error) {
	id, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return false, err
	}
	return exists(ctx, db.sql, `SELECT 1 FROM public_projects WHERE project_id = $1`, id)
}

// PublicProjectIDs returns the public projects' IDs.
func (db *DB) PublicProjectIDs(ctx context.Context) (map[string]bool, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT project_id FROM public_projects`)
	ids, err := collect(rows, err, scanString)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// KnownWorkerIDs returns every worker ID a registration or team worker
// ever claimed, in order.
func (db *DB) KnownWorkerIDs(ctx context.Context) ([]string, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT worker_id FROM worker_ids ORDER BY worker_id`)
	return collect(rows, err, scanString)
}

// HeldJob is a job a worker holds now (an open assignment).
type HeldJob struct {
	WorkerID     string
	JobID        string
	Kind         JobKind
	EvaluationID string
	BuildID      string // "" for a flake job
	Attr         string
	DrvPath      string
	Since        time.Time
}

// HeldJobs returns the open assignments with what their jobs are, oldest
// first.
func (db *DB) HeldJobs(ctx context.Context) ([]HeldJob, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT a.worker_id, j.id, j.kind, j.evaluation_id,
		COALESCE(b.id, ''), COALESCE(b.attr, ''), COALESCE(b.drv_path, ''), a.opened_at
		FROM job_assignments a JOIN jobs j ON j.id = a.job_id LEFT JOIN builds b ON b.id = j.build_id
		WHERE a.closed_at IS NULL ORDER BY a.opened_at, a.id`)
	return collect(rows, err, func(r *sql.Rows) (HeldJob, error) {
		var h HeldJob
		var opened int64
		err := r.Scan(&h.WorkerID, &h.JobID, &h.Kind, &h.EvaluationID, &h.BuildID, &h.Attr, &h.DrvPath, &opened)
		h.Since = fromMillis(opened)
		return h, err
	})
}

// CacheStats is a cache's size.
type CacheStats struct {
	Paths   int
	NarSize int64 // uncompressed
	Size    int64 // compressed objects, as stored
}

// ReadCacheStats counts a cache's paths and bytes.
func (db *DB) ReadCacheStats(ctx context.Context, cacheID string) (CacheStats, error) {
	var s CacheStats
	err := db.sql.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(nar_size), 0), COALESCE(SUM(file_size), 0)
		FROM cache_paths WHERE cache_id = $1`, cacheID).Scan(&s.Paths, &s.NarSize, &s.Size)
	return s, err
}

// RecentCachePaths returns a cache's newest paths, at most limit.
func (db *DB) RecentCachePaths(ctx context.Context, cacheID string, limit int) ([]CachePath, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT `+cachePathColumns+` FROM cache_paths WHERE cache_id = $1
		ORDER BY created_at DESC, store_hash LIMIT `+strconv.Itoa(max(limit, 1)), cacheID)
	return collect(rows, err, func(r *sql.Rows) (CachePath, error) { return scanCachePath(r) })
}
