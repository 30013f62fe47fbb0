package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/proxy/admin/admintest"
	"gradient.dev/gradient/proxy/proxystore"
)

// The operator sets a tenant's Hetzner workers from flags, reads them
// back, and reads the tenant's usage of a period.
func TestProxyHetznerAndUsage(t *testing.T) {
	t.Parallel()
	p := admintest.Start(t, t.TempDir(), admintest.Options{})
	env := proxyEnv(p)
	run := func(args ...string) string {
		t.Helper()
		code, out, errOut := gradientEnv(t, env, append([]string{"proxy"}, args...)...)
		if code != exitOK {
			t.Fatalf("gradient proxy %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
		return out
	}
	fails := func(code int, fragment string, args ...string) {
		t.Helper()
		got, _, errOut := gradientEnv(t, env, append([]string{"proxy"}, args...)...)
		if got != code || !strings.Contains(errOut, fragment) {
			t.Fatalf("gradient proxy %s: exit %d, stderr %q; want %d and %q", strings.Join(args, " "), got, errOut, code, fragment)
		}
	}
	run("tenant", "create", "acme")
	out := run("hetzner", "set", "acme", "--max-vms", "3", "--system", "x86_64-linux=cx22@fsn1:2", "--system", "aarch64-linux=cax21",
		"--snapshot-label", "gradient-worker", "--ssh-key", "7", "--label", "team=ci", "--capabilities", "build")
	mustContain(t, out, "Hetzner workers of acme set.", "max VMs", "3", "label gradient-worker", "team=ci",
		"x86_64-linux", "cx22", "fsn1", "aarch64-linux", "cax21")
	var h struct {
		MaxVMs  int `json:"max_vms"`
		Systems map[string]struct {
			ServerType string `json:"server_type"`
			Location   string `json:"location"`
			Slots      int    `json:"slots"`
		} `json:"systems"`
		SSHKeys []int64 `json:"ssh_keys"`
	}
	if err := json.Unmarshal([]byte(run("hetzner", "show", "acme", "--json")), &h); err != nil {
		t.Fatal(err)
	}
	if h.MaxVMs != 3 || h.Systems["x86_64-linux"].Slots != 2 || h.Systems["aarch64-linux"].Slots != 1 || h.Systems["x86_64-linux"].Location != "fsn1" || len(h.SSHKeys) != 1 {
		t.Fatalf("show --json %+v", h)
	}
	if out := run("hetzner", "show", "acme"); strings.Contains(out, "Boot backoff") {
		t.Fatalf("a tenant without failed boots shows a backoff:\n%s", out)
	}
	// Two VMs of x86_64-linux did not boot: show says so, and when the
	// next may.
	failedAt := time.Now().Add(-time.Minute).Truncate(time.Second)
	for range 2 {
		if _, err := p.Store.BootFailed(t.Context(), "acme", "x86_64-linux", failedAt,
			func(n int) time.Duration { return time.Duration(n) * time.Hour }); err != nil {
			t.Fatal(err)
		}
	}
	mustContain(t, run("hetzner", "show", "acme"), "Boot backoff", "FAILED BOOTS", "x86_64-linux  2",
		failedAt.Local().Format("2006-01-02 15:04:05"), failedAt.Add(2*time.Hour).Local().Format("2006-01-02 15:04:05"))
	fails(exitUsage, "want SYSTEM=TYPE", "hetzner", "set", "acme", "--max-vms", "1", "--system", "cx22", "--snapshot-id", "5")
	fails(exitUsage, "numeric Hetzner ID", "hetzner", "set", "acme", "--max-vms", "1", "--snapshot-id", "5", "--ssh-key", "my-key")
	fails(exitFail, "by ID or by label", "hetzner", "set", "acme", "--max-vms", "1", "--enabled=false")

	ctx := t.Context()
	day := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	v, _, err := p.Store.BeginVM(ctx, "acme", proxystore.NewVM{System: "x86_64-linux", ServerType: "cx22", Allowed: proxystore.Capabilities{Build: true}}, day)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store.VMCreated(ctx, v.ID, 4711, day.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store.EndVMUsage(ctx, v.ID, proxystore.VMDeleted, day.Add(3*time.Hour), 2); err != nil {
		t.Fatal(err)
	}
	mustContain(t, run("usage", "acme", "--from", "2026-11-01", "--to", "2026-11-02"), "4711", "cx22", "deleted",
		"acme: 1 VMs, 2 billed units, 2h0m0s of uptime")
	mustContain(t, run("usage", "acme", "--from", "2026-11-02"), "acme: 0 VMs, 0 billed units")
	fails(exitFail, "want an RFC 3339 time", "usage", "acme", "--from", "soon")
}
