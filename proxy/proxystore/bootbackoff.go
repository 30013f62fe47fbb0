package proxystore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// BootBackoff is a tenant's run of consecutive failed boots of one Nix
// system (VMs whose worker never connected within the boot deadline):
// the next VM of that system boots no sooner than RetryAt. A VM of the
// system that connects ends the run (BootSucceeded).
type BootBackoff struct {
	TenantID     string    `json:"tenant_id"`
	System       string    `json:"system"`
	Failures     int       `json:"failed_boots"`
	LastFailedAt time.Time `json:"last_failed_at"`
	RetryAt      time.Time `json:"retry_at"`
}

const bootBackoffColumns = `tenant_id, system, failures, last_failed_at, retry_at`

func scanBootBackoff(row interface{ Scan(...any) error }) (BootBackoff, error) {
	var b BootBackoff
	var last, retry int64
	err := row.Scan(&b.TenantID, &b.System, &b.Failures, &last, &retry)
	b.LastFailedAt, b.RetryAt = sqldb.FromMillis(last), sqldb.FromMillis(retry)
	return b, err
}

// BootFailed counts one more failed boot of the tenant's system at at
// and sets the retry time to at + wait(failures), failures counting
// this one. A tenant deleted meanwhile is ErrNotFound.
func (s *Store) BootFailed(ctx context.Context, tenantID, system string, at time.Time,
	wait func(failures int) time.Duration) (BootBackoff, error) {
	if system == "" || len(system) > maxVMFieldLen {
		return BootBackoff{}, sqldb.Invalid("VM system must be 1 to %d characters", maxVMFieldLen)
	}
	var b BootBackoff
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		t, err := tenantByRef(ctx, tx, tenantID)
		if err != nil {
			return err
		}
		b, err = scanBootBackoff(tx.QueryRowContext(ctx, `SELECT `+bootBackoffColumns+` FROM hetzner_boot_failures
			WHERE tenant_id = $1 AND system = $2`, t.ID, system))
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		b.TenantID, b.System = t.ID, system
		b.Failures++
		b.LastFailedAt = sqldb.FromMillis(at.UnixMilli())
		b.RetryAt = sqldb.FromMillis(at.Add(wait(b.Failures)).UnixMilli())
		_, err = tx.ExecContext(ctx, `INSERT INTO hetzner_boot_failures (`+bootBackoffColumns+`) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (tenant_id, system) DO UPDATE SET failures = excluded.failures,
				last_failed_at = excluded.last_failed_at, retry_at = excluded.retry_at`,
			b.TenantID, b.System, b.Failures, b.LastFailedAt.UnixMilli(), b.RetryAt.UnixMilli())
		return err
	})
	if err != nil {
		return BootBackoff{}, err
	}
	return b, nil
}

// BootSucceeded ends the tenant's run of failed boots of the system (a
// VM of it connected); without a run it does nothing.
func (s *Store) BootSucceeded(ctx context.Context, tenantID, system string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM hetzner_boot_failures WHERE tenant_id = $1 AND system = $2`, tenantID, system)
	return err
}

// BootBackoffs lists every tenant's runs of failed boots: what the
// reconciler reads once per pass.
func (s *Store) BootBackoffs(ctx context.Context) ([]BootBackoff, error) {
	rows, err := s.sql.QueryContext(ctx, `SELECT `+bootBackoffColumns+` FROM hetzner_boot_failures ORDER BY tenant_id, system`)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (BootBackoff, error) { return scanBootBackoff(r) })
}

// TenantBootBackoffs lists the tenant's (by ID or name) runs of failed
// boots by system.
func (s *Store) TenantBootBackoffs(ctx context.Context, tenant string) ([]BootBackoff, error) {
	t, err := s.Tenant(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := s.sql.QueryContext(ctx, `SELECT `+bootBackoffColumns+` FROM hetzner_boot_failures WHERE tenant_id = $1
		ORDER BY system`, t.ID)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (BootBackoff, error) { return scanBootBackoff(r) })
}
