package proxystore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage/sqldb"
)

// VMOutcome is where a booted VM's usage row stands.
type VMOutcome string

const (
	// VMCreating: the row and the VM's worker row exist, the server is
	// being created (or a crash came between the two: the next pass
	// adopts the labelled server or drops the row). Not billed.
	VMCreating VMOutcome = "creating"
	VMRunning  VMOutcome = "running"
	VMDeleted  VMOutcome = "deleted"
	// VMFailedBoot: deleted because it did not connect within the boot
	// deadline; such a row is not billed.
	VMFailedBoot VMOutcome = "failed_boot"
	// VMMissing: the server vanished without the proxy deleting it; the
	// row is closed when a list no longer shows it.
	VMMissing VMOutcome = "missing"
	// VMLost: deleted because its worker connected, then stayed away
	// longer than the boot deadline; billed for the time it ran.
	VMLost VMOutcome = "lost"
	// VMDrained: deleted after draining (its tenant may not run, its
	// link failed or its Hetzner workers were disabled), once the drain
	// grace ended; billed for the time it ran.
	VMDrained VMOutcome = "drained"
)

// Open reports whether the row still meters a VM.
func (o VMOutcome) Open() bool { return o == VMCreating || o == VMRunning }

// VMUsage meters one VM the proxy booted for a tenant, from its creation
// to its deletion (docs/protocol/federation.md, Hetzner workers).
type VMUsage struct {
	ID         string `json:"id"`
	TenantID   string `json:"tenant_id"`
	TenantName string `json:"tenant_name"`
	// ServerID and ServerName are the cloud's names for the VM; ServerID
	// is 0 while the row is VMCreating.
	ServerID   int64  `json:"server_id"`
	ServerName string `json:"server_name"`
	System     string `json:"system"`
	ServerType string `json:"server_type"`
	Location   string `json:"location,omitempty"`
	// WorkerID is the authorized worker the VM boots as.
	WorkerID string `json:"worker_id"`
	// CreatedAt is when the server was created (billing starts), or
	// while VMCreating when the creation began.
	CreatedAt time.Time  `json:"created_at"`
	DeletedAt *time.Time `json:"deleted_at,omitempty"`
	Outcome   VMOutcome  `json:"outcome"`
	// BilledUnits is set when the row ends: started billing units of
	// uptime, 0 for VMFailedBoot.
	BilledUnits int `json:"billed_units"`
	// ConnectedAt is when the VM's worker first held a session.
	ConnectedAt *time.Time `json:"connected_at,omitempty"`
	// DrainingSince is when the proxy began to drain the VM.
	DrainingSince *time.Time `json:"draining_since,omitempty"`
	// WorkerAddr is the source address of the first handshake the VM's
	// worker token passed; the token is accepted from there only
	// (BindVMWorker).
	WorkerAddr string `json:"worker_addr,omitempty"`
}

// maxVMFieldLen bounds the cloud's names stored in a usage row.
const maxVMFieldLen = 255

const vmColumns = `id, tenant_id, tenant_name, server_id, server_name, system, server_type, location, worker_id,
	created_at, deleted_at, outcome, billed_units, connected_at, draining_since, worker_addr`

func scanVM(row interface{ Scan(...any) error }) (VMUsage, error) {
	var v VMUsage
	var created int64
	var deleted, connected, draining sql.NullInt64
	var addr sql.NullString
	err := row.Scan(&v.ID, &v.TenantID, &v.TenantName, &v.ServerID, &v.ServerName, &v.System, &v.ServerType, &v.Location,
		&v.WorkerID, &created, &deleted, &v.Outcome, &v.BilledUnits, &connected, &draining, &addr)
	v.WorkerAddr = addr.String
	v.CreatedAt = sqldb.FromMillis(created)
	v.DeletedAt, v.ConnectedAt, v.DrainingSince = optionalTime(deleted), optionalTime(connected), optionalTime(draining)
	return v, err
}

func optionalTime(ms sql.NullInt64) *time.Time {
	if !ms.Valid {
		return nil
	}
	at := sqldb.FromMillis(ms.Int64)
	return &at
}

// NewVM is what BeginVM needs to know of a VM about to be created.
type NewVM struct {
	System, ServerType, Location string
	// Allowed is what the VM's worker row may do.
	Allowed Capabilities
}

// VMWorkerName is the name of the worker row a VM boots as.
func VMWorkerName(usageID string) string { return "hetzner-" + usageID }

// BeginVM writes, in one transaction, a VMCreating usage row and the
// worker row the VM will boot as, and returns the row and the worker's
// token, shown this once (only its argon2id hash is stored). The
// server's name is "gradient-" and the row's ID. Create the server
// next, then call VMCreated; AbandonVM when the creation failed.
func (s *Store) BeginVM(ctx context.Context, tenant string, vm NewVM, at time.Time) (VMUsage, string, error) {
	for what, v := range map[string]string{"system": vm.System, "server type": vm.ServerType} {
		if v == "" || len(v) > maxVMFieldLen {
			return VMUsage{}, "", sqldb.Invalid("VM %s must be 1 to %d characters", what, maxVMFieldLen)
		}
	}
	if len(vm.Location) > maxVMFieldLen {
		return VMUsage{}, "", sqldb.Invalid("VM location is longer than %d characters", maxVMFieldLen)
	}
	if vm.Allowed == (Capabilities{}) {
		return VMUsage{}, "", sqldb.Invalid("a VM's worker would be allowed nothing")
	}
	token, err := secret.Generate()
	if err != nil {
		return VMUsage{}, "", err
	}
	hash, err := secret.Hash(token) // before the transaction: argon2id is slow
	if err != nil {
		return VMUsage{}, "", err
	}
	id := sqldb.NewID()
	v := VMUsage{ID: id, ServerName: "gradient-" + id, System: vm.System, ServerType: vm.ServerType, Location: vm.Location,
		WorkerID: sqldb.NewID(), CreatedAt: sqldb.FromMillis(at.UnixMilli()), Outcome: VMCreating}
	err = s.db.InTx(ctx, func(tx *sql.Tx) error {
		t, err := tenantByRef(ctx, tx, tenant)
		if err != nil {
			return err
		}
		v.TenantID, v.TenantName = t.ID, t.Name
		if _, err := tx.ExecContext(ctx, `INSERT INTO authorized_workers (`+workerColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			v.WorkerID, VMWorkerName(id), t.ID, hash, vm.Allowed.Fetch, vm.Allowed.Eval, vm.Allowed.Build, v.CreatedAt.UnixMilli()); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO vm_usage (`+vmColumns+`)
			VALUES ($1, $2, $3, 0, $4, $5, $6, $7, $8, $9, NULL, 'creating', 0, NULL, NULL, NULL)`,
			v.ID, v.TenantID, v.TenantName, v.ServerName, v.System, v.ServerType, v.Location, v.WorkerID, v.CreatedAt.UnixMilli())
		return err
	})
	if err != nil {
		return VMUsage{}, "", err
	}
	return v, token, nil
}

// VMCreated marks a VMCreating row running: the server exists with
// serverID since at, where billing starts.
func (s *Store) VMCreated(ctx context.Context, id string, serverID int64, at time.Time) (VMUsage, error) {
	if serverID <= 0 {
		return VMUsage{}, sqldb.Invalid("VM server ID %d is not positive", serverID)
	}
	return s.updateVM(ctx, id, func(v *VMUsage) (string, []any, error) {
		if v.Outcome != VMCreating {
			return "", nil, sqldb.Conflict("VM usage %s is %s, not creating", v.ID, v.Outcome)
		}
		v.ServerID, v.Outcome, v.CreatedAt = serverID, VMRunning, sqldb.FromMillis(at.UnixMilli())
		return `server_id = $2, outcome = 'running', created_at = $3`, []any{serverID, v.CreatedAt.UnixMilli()}, nil
	})
}

// AbandonVM removes a VMCreating row and its worker row: the server was
// never created, so nothing is billed.
func (s *Store) AbandonVM(ctx context.Context, id string) error {
	id, err := sqldb.CanonicalUUID("VM usage ID", id)
	if err != nil {
		return err
	}
	return s.db.InTx(ctx, func(tx *sql.Tx) error {
		v, err := vmByID(ctx, tx, id)
		if err != nil {
			return err
		}
		if v.Outcome != VMCreating {
			return sqldb.Conflict("VM usage %s is %s; only a creating row is abandoned", id, v.Outcome)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM authorized_workers WHERE worker_id = $1`, v.WorkerID); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM vm_usage WHERE id = $1`, id)
		return err
	})
}

// MarkVMConnected records when the VM's worker first connected; later
// calls keep the first time.
func (s *Store) MarkVMConnected(ctx context.Context, id string, at time.Time) (VMUsage, error) {
	return s.updateVM(ctx, id, func(v *VMUsage) (string, []any, error) {
		if v.ConnectedAt != nil {
			return "", nil, nil
		}
		t := sqldb.FromMillis(at.UnixMilli())
		v.ConnectedAt = &t
		return `connected_at = $2`, []any{t.UnixMilli()}, nil
	})
}

// MarkVMDraining records when the proxy began to drain the VM; later
// calls keep the first time.
func (s *Store) MarkVMDraining(ctx context.Context, id string, at time.Time) (VMUsage, error) {
	return s.updateVM(ctx, id, func(v *VMUsage) (string, []any, error) {
		if v.DrainingSince != nil {
			return "", nil, nil
		}
		t := sqldb.FromMillis(at.UnixMilli())
		v.DrainingSince = &t
		return `draining_since = $2`, []any{t.UnixMilli()}, nil
	})
}

// EndVMUsage closes an open row at with outcome VMDeleted, VMFailedBoot
// (billed must then be 0), VMMissing, VMLost or VMDrained, and billed units; the VM's
// worker row goes in the same transaction (the caller closes its
// session). A row already closed is ErrConflict.
func (s *Store) EndVMUsage(ctx context.Context, id string, outcome VMOutcome, at time.Time, billed int) (VMUsage, error) {
	if outcome != VMDeleted && outcome != VMFailedBoot && outcome != VMMissing && outcome != VMLost && outcome != VMDrained {
		return VMUsage{}, sqldb.Invalid("a VM ends as %q, %q, %q, %q or %q, not %q", VMDeleted, VMFailedBoot, VMMissing, VMLost,
			VMDrained, outcome)
	}
	if billed < 0 || outcome == VMFailedBoot && billed != 0 {
		return VMUsage{}, sqldb.Invalid("a VM ending as %s cannot bill %d units", outcome, billed)
	}
	var worker string
	v, err := s.updateVM(ctx, id, func(v *VMUsage) (string, []any, error) {
		if !v.Outcome.Open() {
			return "", nil, sqldb.Conflict("VM usage %s already ended (%s)", v.ID, v.Outcome)
		}
		end := sqldb.FromMillis(max(at.UnixMilli(), v.CreatedAt.UnixMilli()))
		v.DeletedAt, v.Outcome, v.BilledUnits = &end, outcome, billed
		worker = v.WorkerID
		return `deleted_at = $2, outcome = $3, billed_units = $4`, []any{end.UnixMilli(), outcome, billed}, nil
	}, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM authorized_workers WHERE worker_id = $1`, worker)
		return err
	})
	return v, err
}

func vmByID(ctx context.Context, q sqldb.Querier, id string) (VMUsage, error) {
	v, err := scanVM(q.QueryRowContext(ctx, `SELECT `+vmColumns+` FROM vm_usage WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return VMUsage{}, sqldb.NotFound("VM usage %s", id)
	}
	return v, err
}

// updateVM reads the row, lets change set its fields (returning the SET
// clause with $2.. and its arguments; "" changes nothing), and runs then.
func (s *Store) updateVM(ctx context.Context, id string, change func(*VMUsage) (string, []any, error),
	then ...func(context.Context, *sql.Tx) error) (VMUsage, error) {
	id, err := sqldb.CanonicalUUID("VM usage ID", id)
	if err != nil {
		return VMUsage{}, err
	}
	var v VMUsage
	err = s.db.InTx(ctx, func(tx *sql.Tx) error {
		var err error
		if v, err = vmByID(ctx, tx, id); err != nil {
			return err
		}
		set, args, err := change(&v)
		if err != nil || set == "" {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE vm_usage SET `+set+` WHERE id = $1`, append([]any{id}, args...)...); err != nil {
			return err
		}
		for _, f := range then {
			if err := f(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return VMUsage{}, err
	}
	return v, nil
}

// OpenVMs lists every tenant's open rows (creating or running), oldest
// first: what the reconciler compares with the cloud's servers.
func (s *Store) OpenVMs(ctx context.Context) ([]VMUsage, error) {
	rows, err := s.sql.QueryContext(ctx, `SELECT `+vmColumns+` FROM vm_usage
		WHERE outcome IN ('creating', 'running') ORDER BY created_at, id`)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (VMUsage, error) { return scanVM(r) })
}

// VMUsages lists the tenant's usage rows, oldest first.
func (s *Store) VMUsages(ctx context.Context, tenant string) ([]VMUsage, error) {
	return s.VMUsagesBetween(ctx, tenant, time.Time{}, time.Time{})
}

// VMUsagesBetween lists the tenant's rows (by ID or name; a deleted
// tenant's rows by its ID or last name) whose VM existed during [from,
// to): created before to and not deleted before from. A zero from or to
// leaves that side open.
func (s *Store) VMUsagesBetween(ctx context.Context, tenant string, from, to time.Time) ([]VMUsage, error) {
	column, key := "tenant_name", tenant
	if id, err := sqldb.CanonicalUUID("tenant ID", tenant); err == nil {
		column, key = "tenant_id", id
	}
	fromMs, toMs := int64(0), int64(1<<62)
	if !from.IsZero() {
		fromMs = from.UnixMilli()
	}
	if !to.IsZero() {
		toMs = to.UnixMilli()
	}
	if toMs < fromMs {
		return nil, sqldb.Invalid("the period ends before it starts")
	}
	rows, err := s.sql.QueryContext(ctx, `SELECT `+vmColumns+` FROM vm_usage
		WHERE `+column+` = $1 AND outcome <> 'creating' AND created_at < $3 AND (deleted_at IS NULL OR deleted_at >= $2)
		ORDER BY created_at, id`, key, fromMs, toMs)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (VMUsage, error) { return scanVM(r) })
}
