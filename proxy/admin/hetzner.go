package admin

import (
	"errors"
	"net/http"
	"time"

	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb"
)

// hetznerIn is the body of PUT /api/v1/tenants/{tenant}/hetzner: the
// whole configuration, replacing the one before.
type hetznerIn struct {
	Enabled       bool                                `json:"enabled"`
	MaxVMs        int                                 `json:"max_vms"`
	Systems       map[string]proxystore.HetznerSystem `json:"systems"`
	SnapshotID    int64                               `json:"snapshot_id"`
	SnapshotLabel string                              `json:"snapshot_label"`
	SSHKeys       []int64                             `json:"ssh_keys"`
	Labels        map[string]string                   `json:"labels"`
	// Capabilities are what the VMs' workers may do; absent: all three.
	Capabilities *[]string `json:"capabilities"`
}

// hetznerView is a tenant's Hetzner configuration as the API shows it.
type hetznerView struct {
	Tenant        string                              `json:"tenant"`
	TenantID      string                              `json:"tenant_id"`
	Enabled       bool                                `json:"enabled"`
	MaxVMs        int                                 `json:"max_vms"`
	Systems       map[string]proxystore.HetznerSystem `json:"systems"`
	SnapshotID    int64                               `json:"snapshot_id,omitempty"`
	SnapshotLabel string                              `json:"snapshot_label,omitempty"`
	SSHKeys       []int64                             `json:"ssh_keys"`
	Labels        map[string]string                   `json:"labels"`
	Capabilities  []string                            `json:"capabilities"`
	UpdatedAt     time.Time                           `json:"updated_at"`
	// BootBackoff (show only) lists the systems whose VMs did not boot:
	// consecutive failed boots and when the next VM may boot.
	BootBackoff []proxystore.BootBackoff `json:"boot_backoff,omitempty"`
}

func viewHetzner(c proxystore.HetznerConfig) hetznerView {
	return hetznerView{Tenant: c.TenantName, TenantID: c.TenantID, Enabled: c.Enabled, MaxVMs: c.MaxVMs, Systems: c.Systems,
		SnapshotID: c.SnapshotID, SnapshotLabel: c.SnapshotLabel, SSHKeys: c.SSHKeys, Labels: c.Labels,
		Capabilities: capabilityNames(c.Allowed), UpdatedAt: c.UpdatedAt}
}

func (a *API) setHetzner(w http.ResponseWriter, r *http.Request) {
	var in hetznerIn
	if err := jsonapi.Decode(w, r, &in); err != nil {
		a.fail(w, r, err)
		return
	}
	allowed, err := parseAllowed(in.Capabilities)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	c, err := a.store.SetHetznerConfig(r.Context(), r.PathValue("tenant"), proxystore.HetznerConfig{
		Enabled: in.Enabled, MaxVMs: in.MaxVMs, Systems: in.Systems, SnapshotID: in.SnapshotID, SnapshotLabel: in.SnapshotLabel,
		SSHKeys: in.SSHKeys, Labels: in.Labels, Allowed: allowed})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("admin: Hetzner configuration set", "tenant", c.TenantName, "enabled", c.Enabled, "max_vms", c.MaxVMs,
		"systems", c.SortedSystems())
	jsonapi.Write(w, http.StatusOK, viewHetzner(c))
}

func (a *API) showHetzner(w http.ResponseWriter, r *http.Request) {
	c, err := a.store.HetznerConfig(r.Context(), r.PathValue("tenant"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	v := viewHetzner(c)
	if v.BootBackoff, err = a.store.TenantBootBackoffs(r.Context(), c.TenantID); err != nil {
		a.fail(w, r, err)
		return
	}
	jsonapi.Write(w, http.StatusOK, v)
}

// usageView is a tenant's VM usage in a period.
type usageView struct {
	Tenant string    `json:"tenant"`
	From   time.Time `json:"from,omitzero"`
	To     time.Time `json:"to,omitzero"`
	// BilledUnits sums the billed units of the ended VMs listed.
	BilledUnits int `json:"billed_units"`
	// UptimeSeconds sums the listed VMs' uptime within the period (a
	// running VM's up to now).
	UptimeSeconds int64                `json:"uptime_seconds"`
	VMs           []proxystore.VMUsage `json:"vms"`
}

// parseWhen reads an RFC 3339 time or a date (midnight UTC).
func parseWhen(what, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, sqldb.Invalid("%s %q: want an RFC 3339 time or a date (2026-12-01)", what, s)
}

// usage lists the tenant's VMs that existed during [from, to) with the
// period's totals; a deleted tenant's bill is found by its ID or name.
func (a *API) usage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	from, errFrom := parseWhen("from", q.Get("from"))
	to, errTo := parseWhen("to", q.Get("to"))
	if err := errors.Join(errFrom, errTo); err != nil {
		a.fail(w, r, err)
		return
	}
	out, err := a.Usage(r.Context(), r.PathValue("tenant"), from, to)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	jsonapi.Write(w, http.StatusOK, out)
}
