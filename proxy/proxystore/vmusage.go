package proxystore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// VMOutcome is where a booted VM's usage row stands.
type VMOutcome string

const (
	VMRunning VMOutcome = "running"
	VMDeleted VMOutcome = "deleted"
	// VMFailedBoot: deleted because it did not connect within the boot
	// deadline; such a row is not billed.
	VMFailedBoot VMOutcome = "failed_boot"
)

// VMUsage meters one VM the proxy booted for a tenant, from its creation
// to its deletion (federation.txt, Hetzner workers).
type VMUsage struct {
	ID         string `json:"id"`
	TenantID   string `json:"tenant_id"`
	TenantName string `json:"tenant_name"`
	// ServerID and ServerName are the cloud's names for the VM.
	ServerID   int64  `json:"server_id"`
	ServerName string `json:"server_name"`
	System     string `json:"system"`
	ServerType string `json:"server_type"`
	// WorkerID is the authorized worker the VM boots as.
	WorkerID  string     `json:"worker_id"`
	CreatedAt time.Time  `json:"created_at"`
	DeletedAt *time.Time `json:"deleted_at,omitempty"`
	Outcome   VMOutcome  `json:"outcome"`
}

// maxVMFieldLen bounds the cloud's names stored in a usage row.
const maxVMFieldLen = 255

const vmColumns = `id, tenant_id, tenant_name, server_id, server_name, system, server_type, worker_id, created_at, deleted_at, outcome`

func scanVM(row interface{ Scan(...any) error }) (VMUsage, error) {
	var v VMUsage
	var created int64
	var deleted sql.NullInt64
	err := row.Scan(&v.ID, &v.TenantID, &v.TenantName, &v.ServerID, &v.ServerName, &v.System, &v.ServerType,
		&v.WorkerID, &created, &deleted, &v.Outcome)
	v.CreatedAt = sqldb.FromMillis(created)
	if deleted.Valid {
		at := sqldb.FromMillis(deleted.Int64)
		v.DeletedAt = &at
	}
	return v, err
}

// StartVMUsage opens a usage row for a VM just created for the tenant;
// vm names the server (ServerID, ServerName, System, ServerType,
// WorkerID), the rest is filled in.
func (s *Store) StartVMUsage(ctx context.Context, tenant string, vm VMUsage) (VMUsage, error) {
	for what, v := range map[string]string{"server name": vm.ServerName, "system": vm.System, "server type": vm.ServerType} {
		if v == "" || len(v) > maxVMFieldLen {
			return VMUsage{}, sqldb.Invalid("VM %s must be 1 to %d characters", what, maxVMFieldLen)
		}
	}
	if vm.ServerID <= 0 {
		return VMUsage{}, sqldb.Invalid("VM server ID %d is not positive", vm.ServerID)
	}
	workerID, err := sqldb.CanonicalUUID("VM worker ID", vm.WorkerID)
	if err != nil {
		return VMUsage{}, err
	}
	v := VMUsage{ID: sqldb.NewID(), ServerID: vm.ServerID, ServerName: vm.ServerName, System: vm.System,
		ServerType: vm.ServerType, WorkerID: workerID, CreatedAt: sqldb.FromMillis(sqldb.NowMillis()), Outcome: VMRunning}
	err = s.db.InTx(ctx, func(tx *sql.Tx) error {
		t, err := tenantByRef(ctx, tx, tenant)
		if err != nil {
			return err
		}
		v.TenantID, v.TenantName = t.ID, t.Name
		_, err = tx.ExecContext(ctx, `INSERT INTO vm_usage (`+vmColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, 'running')`,
			v.ID, v.TenantID, v.TenantName, v.ServerID, v.ServerName, v.System, v.ServerType, v.WorkerID, v.CreatedAt.UnixMilli())
		return err
	})
	if err != nil {
		return VMUsage{}, err
	}
	return v, nil
}

// EndVMUsage closes a running VM's row with outcome VMDeleted or
// VMFailedBoot. A row already closed is ErrConflict.
func (s *Store) EndVMUsage(ctx context.Context, id string, outcome VMOutcome) (VMUsage, error) {
	if outcome != VMDeleted && outcome != VMFailedBoot {
		return VMUsage{}, sqldb.Invalid("a VM ends as %q or %q, not %q", VMDeleted, VMFailedBoot, outcome)
	}
	id, err := sqldb.CanonicalUUID("VM usage ID", id)
	if err != nil {
		return VMUsage{}, err
	}
	var v VMUsage
	err = s.db.InTx(ctx, func(tx *sql.Tx) error {
		var err error
		v, err = scanVM(tx.QueryRowContext(ctx, `SELECT `+vmColumns+` FROM vm_usage WHERE id = $1`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return sqldb.NotFound("VM usage %s", id)
		}
		if err != nil {
			return err
		}
		if v.Outcome != VMRunning {
			return sqldb.Conflict("VM usage %s already ended (%s)", id, v.Outcome)
		}
		at := sqldb.FromMillis(sqldb.NowMillis())
		v.DeletedAt, v.Outcome = &at, outcome
		_, err = tx.ExecContext(ctx, `UPDATE vm_usage SET deleted_at = $2, outcome = $3 WHERE id = $1`, id, at.UnixMilli(), outcome)
		return err
	})
	if err != nil {
		return VMUsage{}, err
	}
	return v, nil
}

// VMUsages lists the tenant's usage rows, oldest first.
func (s *Store) VMUsages(ctx context.Context, tenant string) ([]VMUsage, error) {
	t, err := s.Tenant(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := s.sql.QueryContext(ctx, `SELECT `+vmColumns+` FROM vm_usage WHERE tenant_id = $1 ORDER BY created_at, id`, t.ID)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (VMUsage, error) { return scanVM(r) })
}
