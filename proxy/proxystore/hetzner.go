package proxystore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// HetznerSystem is how the proxy boots a VM for one Nix system.
type HetznerSystem struct {
	// ServerType is the Hetzner server type's name (cx22, cax21, ...).
	ServerType string `json:"server_type"`
	// Location is the Hetzner location's name (fsn1, ...); empty lets
	// Hetzner choose.
	Location string `json:"location,omitempty"`
	// Slots is how many jobs one VM runs at once (its worker's build
	// slots); the reconciler boots ceil(pending / Slots) VMs.
	Slots int `json:"slots"`
}

// HetznerConfig is a tenant's Hetzner Cloud workers (docs/protocol/federation.md
// "Hetzner Workers").
type HetznerConfig struct {
	TenantID   string `json:"tenant_id"`
	TenantName string `json:"tenant_name"`
	Enabled    bool   `json:"enabled"`
	// MaxVMs bounds the tenant's VMs over all systems.
	MaxVMs int `json:"max_vms"`
	// Systems maps a Nix system (x86_64-linux) to how its VMs boot; a
	// system not named gets no VMs.
	Systems map[string]HetznerSystem `json:"systems"`
	// SnapshotID is the worker snapshot's image ID; 0 picks the newest
	// available snapshot labelled SnapshotLabel (a Hetzner label
	// selector, e.g. "gradient-worker" or "gradient-worker=v3") for the
	// system's architecture.
	SnapshotID    int64  `json:"snapshot_id,omitempty"`
	SnapshotLabel string `json:"snapshot_label,omitempty"`
	// SSHKeys are Hetzner SSH key IDs added to every VM.
	SSHKeys []int64 `json:"ssh_keys"`
	// Labels are added to every server; keys starting with gradient-
	// are the proxy's own.
	Labels map[string]string `json:"labels"`
	// Allowed is what the VMs' worker rows may do.
	Allowed   Capabilities `json:"allowed"`
	UpdatedAt time.Time    `json:"updated_at"`
}

// MaxHetznerVMs bounds a tenant's max VMs (a typo should not boot 10⁶).
const MaxHetznerVMs = 1000

// maxSlots bounds a VM's slots.
const maxSlots = 256

// CheckHetznerConfig validates c as SetHetznerConfig stores it.
func CheckHetznerConfig(c HetznerConfig) error {
	if c.MaxVMs < 0 || c.MaxVMs > MaxHetznerVMs {
		return sqldb.Invalid("max VMs %d: want 0 to %d", c.MaxVMs, MaxHetznerVMs)
	}
	if c.SnapshotID < 0 {
		return sqldb.Invalid("snapshot ID %d is negative", c.SnapshotID)
	}
	if c.SnapshotID == 0 && c.SnapshotLabel == "" {
		return sqldb.Invalid("name the worker snapshot by ID or by label")
	}
	if c.SnapshotID != 0 && c.SnapshotLabel != "" {
		return sqldb.Invalid("name the worker snapshot by ID or by label, not both")
	}
	if c.SnapshotLabel != "" && !validSelector(c.SnapshotLabel) {
		return sqldb.Invalid("snapshot label selector %q: want key or key=value of letters, digits, '-', '_', '.', '/'", c.SnapshotLabel)
	}
	if c.Enabled && len(c.Systems) == 0 {
		return sqldb.Invalid("an enabled configuration needs a server type for at least one system")
	}
	if c.Allowed == (Capabilities{}) {
		return sqldb.Invalid("the VMs' workers would be allowed nothing (want some of fetch, eval, build)")
	}
	for system, s := range c.Systems {
		if !validSystem(system) {
			return sqldb.Invalid("system %q: want a Nix system such as x86_64-linux", system)
		}
		if !validHetznerName(s.ServerType) {
			return sqldb.Invalid("system %s: server type %q: want a Hetzner server type name", system, s.ServerType)
		}
		if s.Location != "" && !validHetznerName(s.Location) {
			return sqldb.Invalid("system %s: location %q: want a Hetzner location name", system, s.Location)
		}
		if s.Slots < 1 || s.Slots > maxSlots {
			return sqldb.Invalid("system %s: slots %d: want 1 to %d", system, s.Slots, maxSlots)
		}
	}
	for _, k := range c.SSHKeys {
		if k <= 0 {
			return sqldb.Invalid("SSH key ID %d is not positive", k)
		}
	}
	for k, v := range c.Labels {
		if strings.HasPrefix(k, "gradient-") {
			return sqldb.Invalid("label %q: keys starting with gradient- are the proxy's", k)
		}
		if !validLabelKey(k) || !validLabelValue(v) {
			return sqldb.Invalid("label %q=%q: not a Hetzner label", k, v)
		}
	}
	return nil
}

// validSystem: arch-os, the characters Nix systems use.
func validSystem(s string) bool {
	if len(s) == 0 || len(s) > 64 || !strings.Contains(s, "-") {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validHetznerName: the lowercase names of server types and locations.
func validHetznerName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// validLabelValue: Hetzner's rule, up to 63 of [A-Za-z0-9._-],
// alphanumeric at both ends (or empty).
func validLabelValue(v string) bool {
	if len(v) > 63 {
		return false
	}
	for i, c := range v {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && ((i == 0 || i == len(v)-1) || c != '-' && c != '_' && c != '.') {
			return false
		}
	}
	return true
}

// validLabelKey: an optional DNS prefix and '/', then a name by the
// value's rule, not empty.
func validLabelKey(k string) bool {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		prefix, name = "", k
	} else if prefix == "" || len(prefix) > 253 || !validLabelValue(strings.ReplaceAll(prefix, ".", "-")) {
		return false
	}
	return name != "" && validLabelValue(name)
}

// validSelector: key or key=value (the one form the reconciler sends).
func validSelector(s string) bool {
	k, v, _ := strings.Cut(s, "=")
	return validLabelKey(k) && validLabelValue(v)
}

// SetHetznerConfig sets the tenant's Hetzner configuration, replacing
// any before. Disabling it drains the tenant's VMs at the next pass.
func (s *Store) SetHetznerConfig(ctx context.Context, tenant string, c HetznerConfig) (HetznerConfig, error) {
	if c.Systems == nil {
		c.Systems = map[string]HetznerSystem{}
	}
	if c.SSHKeys == nil {
		c.SSHKeys = []int64{}
	}
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	if err := CheckHetznerConfig(c); err != nil {
		return HetznerConfig{}, err
	}
	systems, _ := json.Marshal(c.Systems)
	keys, _ := json.Marshal(c.SSHKeys)
	labels, _ := json.Marshal(c.Labels)
	var tenantID string
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		t, err := tenantByRef(ctx, tx, tenant)
		if err != nil {
			return err
		}
		tenantID = t.ID
		_, err = tx.ExecContext(ctx, `INSERT INTO hetzner_configs
			(tenant_id, enabled, max_vms, snapshot_id, snapshot_label, systems, ssh_keys, labels, allow_fetch, allow_eval, allow_build, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
			ON CONFLICT (tenant_id) DO UPDATE SET enabled = excluded.enabled, max_vms = excluded.max_vms,
				snapshot_id = excluded.snapshot_id, snapshot_label = excluded.snapshot_label, systems = excluded.systems,
				ssh_keys = excluded.ssh_keys, labels = excluded.labels, allow_fetch = excluded.allow_fetch,
				allow_eval = excluded.allow_eval, allow_build = excluded.allow_build, updated_at = excluded.updated_at`,
			t.ID, c.Enabled, c.MaxVMs, c.SnapshotID, c.SnapshotLabel, string(systems), string(keys), string(labels),
			c.Allowed.Fetch, c.Allowed.Eval, c.Allowed.Build, sqldb.NowMillis())
		return err
	})
	if err != nil {
		return HetznerConfig{}, err
	}
	return s.HetznerConfig(ctx, tenantID)
}

const hetznerColumns = `c.tenant_id, t.name, c.enabled, c.max_vms, c.snapshot_id, c.snapshot_label, c.systems, c.ssh_keys, c.labels,
	c.allow_fetch, c.allow_eval, c.allow_build, c.updated_at`

func scanHetzner(row interface{ Scan(...any) error }) (HetznerConfig, error) {
	var c HetznerConfig
	var systems, keys, labels string
	var updated int64
	err := row.Scan(&c.TenantID, &c.TenantName, &c.Enabled, &c.MaxVMs, &c.SnapshotID, &c.SnapshotLabel, &systems, &keys, &labels,
		&c.Allowed.Fetch, &c.Allowed.Eval, &c.Allowed.Build, &updated)
	if err != nil {
		return c, err
	}
	c.UpdatedAt = sqldb.FromMillis(updated)
	if err := errors.Join(json.Unmarshal([]byte(systems), &c.Systems), json.Unmarshal([]byte(keys), &c.SSHKeys),
		json.Unmarshal([]byte(labels), &c.Labels)); err != nil {
		return c, err
	}
	return c, nil
}

// HetznerConfig is the tenant's configuration; ErrNotFound when it has
// none.
func (s *Store) HetznerConfig(ctx context.Context, tenant string) (HetznerConfig, error) {
	t, err := s.Tenant(ctx, tenant)
	if err != nil {
		return HetznerConfig{}, err
	}
	c, err := scanHetzner(s.sql.QueryRowContext(ctx, `SELECT `+hetznerColumns+`
		FROM hetzner_configs c JOIN tenants t ON t.id = c.tenant_id WHERE c.tenant_id = $1`, t.ID))
	if errors.Is(err, sql.ErrNoRows) {
		return HetznerConfig{}, sqldb.NotFound("tenant %q has no Hetzner configuration", t.Name)
	}
	return c, err
}

// HetznerConfigs lists every tenant's configuration by tenant name.
func (s *Store) HetznerConfigs(ctx context.Context) ([]HetznerConfig, error) {
	rows, err := s.sql.QueryContext(ctx, `SELECT `+hetznerColumns+`
		FROM hetzner_configs c JOIN tenants t ON t.id = c.tenant_id ORDER BY t.name`)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (HetznerConfig, error) { return scanHetzner(r) })
}

// SortedSystems are the configuration's systems in order.
func (c HetznerConfig) SortedSystems() []string { return slices.Sorted(maps.Keys(c.Systems)) }
