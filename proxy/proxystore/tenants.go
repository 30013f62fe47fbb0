package proxystore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// Tenant is a customer whose Gradient server the proxy serves as one
// worker. MayRun false stops its upstream session (and, later, its VMs)
// without forgetting its link or workers.
type Tenant struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	MayRun    bool      `json:"may_run"`
	CreatedAt time.Time `json:"created_at"`
}

const tenantColumns = `id, name, may_run, created_at`

func scanTenant(row interface{ Scan(...any) error }) (Tenant, error) {
	var t Tenant
	var created int64
	err := row.Scan(&t.ID, &t.Name, &t.MayRun, &created)
	t.CreatedAt = sqldb.FromMillis(created)
	return t, err
}

// CreateTenant adds a tenant that may run. Its name is a slug that does
// not read as a UUID (sqldb.ValidName), unique among tenants.
func (s *Store) CreateTenant(ctx context.Context, name string) (Tenant, error) {
	if err := sqldb.ValidName("tenant", name); err != nil {
		return Tenant{}, err
	}
	t := Tenant{ID: sqldb.NewID(), Name: name, MayRun: true, CreatedAt: sqldb.FromMillis(sqldb.NowMillis())}
	_, err := s.db.Exec(ctx, `INSERT INTO tenants (`+tenantColumns+`) VALUES ($1, $2, $3, $4)`,
		t.ID, t.Name, t.MayRun, t.CreatedAt.UnixMilli())
	if sqldb.ConstraintOf(err) == sqldb.UniqueViolation {
		return Tenant{}, sqldb.Conflict("tenant %q already exists", name)
	}
	if err != nil {
		return Tenant{}, err
	}
	return t, nil
}

// Tenants lists every tenant by name.
func (s *Store) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.sql.QueryContext(ctx, `SELECT `+tenantColumns+` FROM tenants ORDER BY name`)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (Tenant, error) { return scanTenant(r) })
}

// Tenant finds a tenant by ID or by name (names never read as UUIDs).
func (s *Store) Tenant(ctx context.Context, nameOrID string) (Tenant, error) {
	return tenantByRef(ctx, s.sql, nameOrID)
}

func tenantByRef(ctx context.Context, q sqldb.Querier, nameOrID string) (Tenant, error) {
	column, key := "name", nameOrID
	if id, err := sqldb.CanonicalUUID("tenant ID", nameOrID); err == nil {
		column, key = "id", id
	}
	t, err := scanTenant(q.QueryRowContext(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE `+column+` = $1`, key))
	if errors.Is(err, sql.ErrNoRows) {
		return Tenant{}, sqldb.NotFound("tenant %q", nameOrID)
	}
	return t, err
}

// SetTenantMayRun allows or stops the tenant's work.
func (s *Store) SetTenantMayRun(ctx context.Context, nameOrID string, mayRun bool) (Tenant, error) {
	var t Tenant
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		var err error
		if t, err = tenantByRef(ctx, tx, nameOrID); err != nil {
			return err
		}
		t.MayRun = mayRun
		_, err = tx.ExecContext(ctx, `UPDATE tenants SET may_run = $2 WHERE id = $1`, t.ID, mayRun)
		return err
	})
	return t, err
}

// DeleteTenant removes a tenant with its link, its tokens and its
// workers. A tenant with a running VM is refused: its meter would never
// close. Ended VM usage rows stay, as the bill.
func (s *Store) DeleteTenant(ctx context.Context, nameOrID string) error {
	return s.db.InTx(ctx, func(tx *sql.Tx) error {
		t, err := tenantByRef(ctx, tx, nameOrID)
		if err != nil {
			return err
		}
		running, err := sqldb.Exists(ctx, tx, `SELECT 1 FROM vm_usage WHERE tenant_id = $1 AND outcome IN ('creating', 'running')`, t.ID)
		if err != nil {
			return err
		}
		if running {
			return sqldb.Conflict("tenant %q has running VMs; disable its Hetzner workers and wait until they are deleted", t.Name)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM tenants WHERE id = $1`, t.ID)
		return err
	})
}
