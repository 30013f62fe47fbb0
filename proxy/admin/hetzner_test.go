package admin_test

import (
	"net/http"
	"testing"
	"time"

	"gradient.dev/gradient/proxy/admin/admintest"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

type hetznerView struct {
	Tenant        string                              `json:"tenant"`
	Enabled       bool                                `json:"enabled"`
	MaxVMs        int                                 `json:"max_vms"`
	Systems       map[string]proxystore.HetznerSystem `json:"systems"`
	SnapshotID    int64                               `json:"snapshot_id"`
	SnapshotLabel string                              `json:"snapshot_label"`
	SSHKeys       []int64                             `json:"ssh_keys"`
	Labels        map[string]string                   `json:"labels"`
	Capabilities  []string                            `json:"capabilities"`
}

// A tenant's Hetzner configuration is set whole and shown; bad input is
// 400 with the reason, an unknown tenant 404.
func TestHetznerConfiguration(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		p := admintest.Start(t, dbURL, admintest.Options{})
		c := newClient(t, p)
		c.ok(http.StatusCreated, "POST", "/api/v1/tenants", `{"name":"acme"}`, nil)
		c.fails(http.StatusNotFound, "no Hetzner configuration", "GET", "/api/v1/tenants/acme/hetzner", "")
		var h hetznerView
		c.ok(http.StatusOK, "PUT", "/api/v1/tenants/acme/hetzner", `{"enabled":true,"max_vms":4,
			"systems":{"x86_64-linux":{"server_type":"cx22","location":"fsn1","slots":2},"aarch64-linux":{"server_type":"cax21","slots":4}},
			"snapshot_label":"gradient-worker","ssh_keys":[7],"labels":{"team":"ci"},"capabilities":["build"]}`, &h)
		if h.Tenant != "acme" || !h.Enabled || h.MaxVMs != 4 || h.Systems["aarch64-linux"].Slots != 4 || h.SnapshotLabel != "gradient-worker" ||
			len(h.SSHKeys) != 1 || h.Labels["team"] != "ci" || len(h.Capabilities) != 1 || h.Capabilities[0] != "build" {
			t.Fatalf("set %+v", h)
		}
		var shown hetznerView
		c.ok(http.StatusOK, "GET", "/api/v1/tenants/acme/hetzner", "", &shown)
		if shown.MaxVMs != 4 || shown.Systems["x86_64-linux"].ServerType != "cx22" {
			t.Fatalf("shown %+v", shown)
		}
		for body, msg := range map[string]string{
			`{"enabled":true,"max_vms":1,"snapshot_id":5}`:   "needs a server type",
			`{"enabled":false,"max_vms":1}`:                  "by ID or by label",
			`{"enabled":false,"max_vms":-1,"snapshot_id":5}`: "max VMs -1",
			`{"enabled":true,"max_vms":1,"snapshot_id":5,"systems":{"x86_64-linux":{"server_type":"cx22","slots":0}}}`: "slots 0",
			`{"enabled":false,"max_vms":1,"snapshot_id":5,"labels":{"gradient-tenant":"x"}}`:                           "the proxy's",
			`{"enabled":false,"max_vms":1,"snapshot_id":5,"capabilities":["federate"]}`:                                "federate",
			`{"enabled":false,"max_vms":1,"snapshot_id":5,"surprise":1}`:                                               "surprise",
		} {
			c.fails(http.StatusBadRequest, msg, "PUT", "/api/v1/tenants/acme/hetzner", body)
		}
		c.fails(http.StatusNotFound, `tenant "nope"`, "PUT", "/api/v1/tenants/nope/hetzner", `{"enabled":false,"max_vms":1,"snapshot_id":5}`)
	})
}

// Usage lists the VMs that existed in the period with their billed
// units; a deleted tenant's bill stays readable.
func TestUsagePerPeriod(t *testing.T) {
	t.Parallel()
	p := admintest.Start(t, sqldbtest.SQLiteURL(t), admintest.Options{})
	c := newClient(t, p)
	ctx := t.Context()
	if _, err := p.Store.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	vm := func(from, to time.Time, outcome proxystore.VMOutcome, billed int) {
		v, _, err := p.Store.BeginVM(ctx, "acme", proxystore.NewVM{System: "x86_64-linux", ServerType: "cx22", Allowed: proxystore.Capabilities{Build: true}}, from)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Store.VMCreated(ctx, v.ID, 42, from); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Store.EndVMUsage(ctx, v.ID, outcome, to, billed); err != nil {
			t.Fatal(err)
		}
	}
	vm(day.Add(-3*time.Hour), day.Add(-2*time.Hour), proxystore.VMDeleted, 1)                // before
	vm(day.Add(time.Hour), day.Add(time.Hour+90*time.Minute), proxystore.VMDeleted, 2)       // inside
	vm(day.Add(5*time.Hour), day.Add(5*time.Hour+5*time.Minute), proxystore.VMFailedBoot, 0) // inside, not billed
	var u struct {
		Tenant        string `json:"tenant"`
		BilledUnits   int    `json:"billed_units"`
		UptimeSeconds int64  `json:"uptime_seconds"`
		VMs           []struct {
			Outcome string `json:"outcome"`
		} `json:"vms"`
	}
	c.ok(http.StatusOK, "GET", "/api/v1/tenants/acme/usage?from=2026-11-01&to=2026-11-02", "", &u)
	if u.Tenant != "acme" || len(u.VMs) != 2 || u.BilledUnits != 2 || u.UptimeSeconds != 95*60 {
		t.Fatalf("usage of the day %+v", u)
	}
	c.ok(http.StatusOK, "GET", "/api/v1/tenants/acme/usage", "", &u)
	if len(u.VMs) != 3 || u.BilledUnits != 3 {
		t.Fatalf("all usage %+v", u)
	}
	c.fails(http.StatusBadRequest, "want an RFC 3339 time", "GET", "/api/v1/tenants/acme/usage?from=yesterday", "")
	c.fails(http.StatusBadRequest, "ends before it starts", "GET", "/api/v1/tenants/acme/usage?from=2026-11-02&to=2026-11-01", "")
	c.fails(http.StatusNotFound, `tenant "nope"`, "GET", "/api/v1/tenants/nope/usage", "")
	if err := p.Store.DeleteTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	c.ok(http.StatusOK, "GET", "/api/v1/tenants/acme/usage", "", &u)
	if len(u.VMs) != 3 {
		t.Fatalf("the deleted tenant's bill %+v", u)
	}
}

// A tenant with an open VM row (even one still being created) is not
// deleted, and none of its workers is revoked by the attempt.
func TestDeleteTenantWithVMsIsRefused(t *testing.T) {
	t.Parallel()
	p := admintest.Start(t, sqldbtest.SQLiteURL(t), admintest.Options{})
	c := newClient(t, p)
	ctx := t.Context()
	if _, err := p.Store.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	v, _, err := p.Store.BeginVM(ctx, "acme", proxystore.NewVM{System: "x86_64-linux", ServerType: "cx22", Allowed: proxystore.Capabilities{Build: true}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c.fails(http.StatusConflict, "has running VMs", "DELETE", "/api/v1/tenants/acme", "")
	if _, err := p.Store.WorkerByID(ctx, v.WorkerID); err != nil {
		t.Fatalf("the refused delete revoked the VM's worker: %v", err)
	}
}
