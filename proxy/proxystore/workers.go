package proxystore

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage/sqldb"
	"gradient.dev/gradient/wire"
)

// Capabilities is what a proxy worker may be asked to do. Federate is
// not among them: the proxy negotiates it off with every worker.
type Capabilities struct {
	Fetch bool `json:"fetch"`
	Eval  bool `json:"eval"`
	Build bool `json:"build"`
}

// Wire is the same set as the protocol's capability flags.
func (c Capabilities) Wire() wire.GradientCapabilities {
	return wire.GradientCapabilities{Fetch: c.Fetch, Eval: c.Eval, Build: c.Build}
}

// ParseCapabilities reads a comma-separated list of fetch, eval and build
// (GRADIENT_PROXY_UPSTREAM_CAPABILITIES, a worker's allowed set).
func ParseCapabilities(list string) (Capabilities, error) {
	var c Capabilities
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		one, ok := wire.CapabilityNamed(strings.ToLower(name))
		switch {
		case one.Federate:
			return Capabilities{}, sqldb.Invalid("capability federate is never granted through the proxy")
		case !ok || one.Core || one.Cache:
			return Capabilities{}, sqldb.Invalid("unknown capability %q (want fetch, eval, build)", name)
		}
		c.Fetch, c.Eval, c.Build = c.Fetch || one.Fetch, c.Eval || one.Eval, c.Build || one.Build
	}
	if c == (Capabilities{}) {
		return Capabilities{}, sqldb.Invalid("no capability named (want some of fetch, eval, build)")
	}
	return c, nil
}

// String is the list ParseCapabilities reads.
func (c Capabilities) String() string {
	return strings.Join(c.Wire().Names(), ",")
}

// Worker is one of the proxy's own workers: it authenticates with its ID
// and token and takes its tenant's jobs within Allowed.
type Worker struct {
	ID       string       `json:"id"`
	Name     string       `json:"name"`
	TenantID string       `json:"tenant_id"`
	Allowed  Capabilities `json:"allowed"`
	// TokenHash is the argon2id PHC string the authority checks the
	// worker's token against (secret.Verifier); never shown.
	TokenHash string    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
}

const workerColumns = `worker_id, name, tenant_id, token_hash, allow_fetch, allow_eval, allow_build, created_at`

func scanWorker(row interface{ Scan(...any) error }) (Worker, error) {
	var w Worker
	var created int64
	err := row.Scan(&w.ID, &w.Name, &w.TenantID, &w.TokenHash, &w.Allowed.Fetch, &w.Allowed.Eval, &w.Allowed.Build, &created)
	w.CreatedAt = sqldb.FromMillis(created)
	return w, err
}

// CreateWorker authorizes a new worker for the tenant and returns it with
// its token, which is shown this once: only its argon2id hash is stored.
// The name is unique within the tenant.
func (s *Store) CreateWorker(ctx context.Context, tenant, name string, allowed Capabilities) (Worker, string, error) {
	if err := sqldb.ValidName("worker", name); err != nil {
		return Worker{}, "", err
	}
	if allowed == (Capabilities{}) {
		return Worker{}, "", sqldb.Invalid("worker %q would be allowed nothing (want some of fetch, eval, build)", name)
	}
	token, err := secret.Generate()
	if err != nil {
		return Worker{}, "", err
	}
	// Hashed before the transaction: argon2id takes tens of milliseconds
	// that SQLite's single writer should not wait for.
	hash, err := secret.Hash(token)
	if err != nil {
		return Worker{}, "", err
	}
	w := Worker{ID: sqldb.NewID(), Name: name, Allowed: allowed, TokenHash: hash, CreatedAt: sqldb.FromMillis(sqldb.NowMillis())}
	err = s.db.InTx(ctx, func(tx *sql.Tx) error {
		t, err := tenantByRef(ctx, tx, tenant)
		if err != nil {
			return err
		}
		w.TenantID = t.ID
		_, err = tx.ExecContext(ctx, `INSERT INTO authorized_workers (`+workerColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			w.ID, w.Name, w.TenantID, w.TokenHash, w.Allowed.Fetch, w.Allowed.Eval, w.Allowed.Build, w.CreatedAt.UnixMilli())
		if sqldb.ConstraintOf(err) == sqldb.UniqueViolation {
			return sqldb.Conflict("tenant %q already has a worker named %q", t.Name, name)
		}
		return err
	})
	if err != nil {
		return Worker{}, "", err
	}
	return w, token, nil
}

// Workers lists the tenant's workers by name.
func (s *Store) Workers(ctx context.Context, tenant string) ([]Worker, error) {
	t, err := s.Tenant(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := s.sql.QueryContext(ctx, `SELECT `+workerColumns+` FROM authorized_workers WHERE tenant_id = $1 ORDER BY name`, t.ID)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (Worker, error) { return scanWorker(r) })
}

// WorkerByID finds an authorized worker, for the authority's handshake.
func (s *Store) WorkerByID(ctx context.Context, workerID string) (Worker, error) {
	id, err := sqldb.CanonicalUUID("worker ID", workerID)
	if err != nil {
		return Worker{}, err
	}
	w, err := scanWorker(s.sql.QueryRowContext(ctx, `SELECT `+workerColumns+` FROM authorized_workers WHERE worker_id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Worker{}, sqldb.NotFound("worker %s", id)
	}
	return w, err
}

// DeleteWorker revokes a worker: its row goes, so its token no longer
// opens a session. Closing its live session is the caller's part.
func (s *Store) DeleteWorker(ctx context.Context, workerID string) error {
	id, err := sqldb.CanonicalUUID("worker ID", workerID)
	if err != nil {
		return err
	}
	res, err := s.db.Exec(ctx, `DELETE FROM authorized_workers WHERE worker_id = $1`, id)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err == nil && n == 0 {
		err = sqldb.NotFound("worker %s", id)
	}
	return err
}
