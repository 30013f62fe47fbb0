package hetzner

import (
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage/sqldb"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

const x86 = "x86_64-linux"

func (r *rig) apiCalls(op, outcome string) int {
	return int(testutil.ToFloat64(r.rec.m.apiCalls.WithLabelValues(op, outcome)))
}

// waitConnected waits until every open row's worker holds a session and
// a pass has recorded it.
func (r *rig) waitConnected(tenantID string, n int) {
	r.t.Helper()
	waitfor.True(r.t, "the VMs' workers connect to the proxy", func() bool {
		rows := r.rows(tenantID)
		if len(rows) != n {
			return false
		}
		for _, row := range rows {
			if !r.sessions.Connected(row.WorkerID) {
				return false
			}
		}
		return true
	})
	r.pass()
	for _, row := range r.rows(tenantID) {
		if row.ConnectedAt == nil {
			r.t.Fatalf("VM %d connected but its row does not say so", row.ServerID)
		}
	}
}

// Scale up boots min(max VMs, ceil(pending / slots)) VMs from the newest
// available snapshot; each VM's user data makes a real worker connect to
// the proxy's /proto with a token minted for it alone (only its hash
// stored); a pass lists servers once, and passes that see the VMs boot
// no more.
func TestScaleUpBootsWorkersThatConnect(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	acme := r.tenant("acme")
	r.demand.set(acme.ID, x86, 3) // ceil(3/2) = 2
	r.pass()
	servers := r.cloud.serversOf(acme.ID)
	if len(servers) != 2 {
		t.Fatalf("%d servers for 3 pending jobs and 2 slots, want 2", len(servers))
	}
	rows := r.rows(acme.ID)
	if len(rows) != 2 {
		t.Fatalf("%d open rows, want 2", len(rows))
	}
	slices.SortFunc(rows, func(a, b proxystore.VMUsage) int { return int(a.ServerID - b.ServerID) })
	for i, s := range servers {
		row := rows[i]
		if s.ID != row.ServerID || s.Name != row.ServerName || row.Outcome != proxystore.VMRunning || row.System != x86 || row.ServerType != "cx22" {
			t.Fatalf("server %+v, row %+v", s.Server, row)
		}
		if s.Image.ID != 100 || s.ServerType.Name != "cx22" || s.Location.Name != "fsn1" {
			t.Fatalf("booted image %d type %s in %s, want the newest available snapshot 100 on cx22 in fsn1", s.Image.ID, s.ServerType.Name, s.Location.Name)
		}
		if s.Labels[LabelTenant] != acme.ID || s.Labels[LabelVM] != row.ID || s.Labels["owner"] != "acme" {
			t.Fatalf("labels %v", s.Labels)
		}
		env := r.env(s.ID)
		token := env[EnvPeers][len(row.WorkerID)+1:]
		if env[EnvServerURL] != r.protoURL || env[EnvWorkerID] != row.WorkerID || env[EnvPeers] != row.WorkerID+":"+token || env[EnvMaxBuilds] != "2" {
			t.Fatalf("env file %v", env)
		}
		w, err := r.store.WorkerByID(t.Context(), row.WorkerID)
		if err != nil || w.TenantID != acme.ID || w.TokenHash == token || !secret.Verify(w.TokenHash, token) || w.Allowed != (proxystore.Capabilities{Build: true}) {
			t.Fatalf("the VM's worker row %+v, %v", w, err)
		}
	}
	if servers[0].UserData == servers[1].UserData {
		t.Fatal("two VMs share one token")
	}
	r.waitConnected(acme.ID, 2)

	r.pass()
	if n := len(r.cloud.serversOf(acme.ID)); n != 2 {
		t.Fatalf("passes that see the VMs booted %d servers in all, want 2", n)
	}
	r.demand.set(acme.ID, x86, 100)
	r.pass()
	if n := len(r.cloud.serversOf(acme.ID)); n != 3 {
		t.Fatalf("%d servers for 100 pending jobs, want max VMs 3", n)
	}
	// Four passes, four server lists: one per pass for all tenants; the
	// images were listed once per pass that booted.
	if got := r.cloud.count("GET /servers"); got != 4 {
		t.Fatalf("%d server lists in 4 passes", got)
	}
	if got := r.apiCalls(opListServers, "ok"); got != 4 {
		t.Fatalf("the metric counts %d server lists, want 4", got)
	}
	if got, want := r.cloud.count("GET /images"), 2; got != want {
		t.Fatalf("%d image lists, want %d (one per booting pass)", got, want)
	}
	if got := r.apiCalls(opCreateServer, "ok"); got != 3 {
		t.Fatalf("the metric counts %d creates, want 3", got)
	}
}

// One server list serves every tenant, and the list pages.
func TestOneListPerPassForAllTenants(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	var tenants []proxystore.Tenant
	for _, name := range []string{"a", "b", "c"} {
		tn := r.tenant(name)
		if name == "c" { // the snapshot by ID
			cfg, _ := r.store.HetznerConfig(t.Context(), tn.ID)
			cfg.SnapshotLabel, cfg.SnapshotID = "", 90
			if _, err := r.store.SetHetznerConfig(t.Context(), tn.ID, cfg); err != nil {
				t.Fatal(err)
			}
		}
		r.noWorkers(tn.ID) // no workers needed here
		r.demand.set(tn.ID, x86, 2)
		tenants = append(tenants, tn)
	}
	r.pass()
	r.pass()
	if got := r.cloud.count("GET /servers"); got != 2 {
		t.Fatalf("%d server lists in 2 passes for 3 tenants", got)
	}
	if got := r.cloud.count("GET /images"); got != 2 {
		t.Fatalf("%d image lists, want one for each tenant booting by label", got)
	}
	for _, tn := range tenants {
		servers := r.cloud.serversOf(tn.ID)
		if len(servers) != 1 {
			t.Fatalf("tenant %s has %d servers, want 1", tn.Name, len(servers))
		}
		if want := map[string]int64{"a": 100, "b": 100, "c": 90}[tn.Name]; servers[0].Image.ID != want {
			t.Fatalf("tenant %s booted image %d, want %d", tn.Name, servers[0].Image.ID, want)
		}
	}
}

// A 429 or 5xx backs the tenant off, 1 s doubling; the other tenant's
// VMs boot meanwhile, and a failed creation leaves no row or worker.
func TestRateLimitBacksOffTheTenantOnly(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	a, b := r.tenant("a"), r.tenant("b")
	r.noWorkers(a.ID)
	r.noWorkers(b.ID)
	r.demand.set(a.ID, x86, 1)
	r.demand.set(b.ID, x86, 1)
	r.cloud.fail(http.MethodPost, "/servers", a.ID, http.StatusTooManyRequests, 1)
	r.pass()
	if len(r.cloud.serversOf(a.ID)) != 0 || len(r.cloud.serversOf(b.ID)) != 1 {
		t.Fatalf("after a's 429: a has %d servers, b %d; want 0 and 1", len(r.cloud.serversOf(a.ID)), len(r.cloud.serversOf(b.ID)))
	}
	if rows := r.rows(a.ID); len(rows) != 0 {
		t.Fatalf("a failed creation left rows %+v", rows)
	}
	if ws, _ := r.store.Workers(t.Context(), a.ID); len(ws) != 0 {
		t.Fatalf("a failed creation left worker rows %+v", ws)
	}
	if r.apiCalls(opCreateServer, "rate_limited") != 1 {
		t.Fatal("the 429 is not counted")
	}
	r.clock.Advance(500 * time.Millisecond)
	r.pass()
	if got := r.cloud.createsOf(a.ID); got != 1 {
		t.Fatalf("a backed off for 1 s was asked %d times within it", got)
	}
	// Two 503s: 1 s, then 2 s.
	r.cloud.fail(http.MethodPost, "/servers", a.ID, http.StatusServiceUnavailable, 2)
	r.clock.Advance(600 * time.Millisecond)
	r.pass() // t=1.1 s: fails, backoff 2 s
	r.clock.Advance(time.Second)
	r.pass() // t=2.1 s: within
	if got := r.cloud.createsOf(a.ID); got != 2 {
		t.Fatalf("creates of a = %d, want 2 (the second backoff is 2 s)", got)
	}
	r.clock.Advance(time.Second + 100*time.Millisecond)
	r.pass() // t=3.2 s: fails again, backoff 4 s
	r.clock.Advance(3 * time.Second)
	r.pass()
	if got := r.cloud.createsOf(a.ID); got != 3 {
		t.Fatalf("creates of a = %d, want 3 (the third backoff is 4 s)", got)
	}
	r.clock.Advance(time.Second + 100*time.Millisecond)
	r.pass()
	if len(r.cloud.serversOf(a.ID)) != 1 {
		t.Fatal("a did not boot after its backoff")
	}
	if r.apiCalls(opCreateServer, "server_error") != 2 {
		t.Fatal("the 503s are not counted")
	}
	if len(r.cloud.serversOf(b.ID)) != 1 {
		t.Fatal("b's VM count changed")
	}

	// A failing list backs off every tenant's pass (it is the one call
	// they share).
	r.cloud.fail(http.MethodGet, "/servers", "", http.StatusBadGateway, 1)
	lists := r.cloud.count("GET /servers")
	if err := r.rec.Pass(t.Context()); err == nil {
		t.Fatal("a pass whose list failed reports no error")
	}
	if err := r.rec.Pass(t.Context()); err != nil || r.cloud.count("GET /servers") != lists+1 {
		t.Fatalf("a backed-off pass listed again (%v)", err)
	}
}

// The leak guard deletes a labelled server without a row and closes a
// row whose server is gone, but neither for a server created moments
// ago that a list does not show yet.
func TestLeakGuard(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	acme := r.tenant("acme")
	r.noWorkers(acme.ID)
	now := r.clock.Now()
	old := r.cloud.addServer("gradient-old", map[string]string{LabelTenant: acme.ID, LabelVM: sqldb.NewID()}, now.Add(-time.Hour))
	fresh := r.cloud.addServer("gradient-fresh", map[string]string{LabelTenant: acme.ID}, now)
	other := r.cloud.addServer("someone-elses", map[string]string{"app": "web"}, now.Add(-time.Hour))
	r.pass()
	if r.cloud.server(old.ID) != nil {
		t.Fatal("a labelled server without a VM row was not deleted")
	}
	if r.cloud.server(fresh.ID) == nil {
		t.Fatal("a labelled server created moments ago was deleted")
	}
	if r.cloud.server(other.ID) == nil {
		t.Fatal("a server without the gradient-tenant label was deleted")
	}
	// A row written before a creation that never happened (a crash
	// between the two) is dropped with its worker after the list grace.
	orphan, _, err := r.store.BeginVM(t.Context(), acme.ID, proxystore.NewVM{System: x86, ServerType: "cx22", Allowed: proxystore.Capabilities{Build: true}}, r.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	r.pass()
	if rows := r.rows(acme.ID); len(rows) != 1 {
		t.Fatalf("a row being created was dropped within the list grace: %+v", rows)
	}
	r.clock.Advance(DefaultListGrace)
	r.pass()
	if r.cloud.server(fresh.ID) != nil {
		t.Fatal("the unlabelled-row server was not deleted after the list grace")
	}
	if rows := r.rows(acme.ID); len(rows) != 0 {
		t.Fatalf("a row whose server never appeared stays: %+v", rows)
	}
	if _, err := r.store.WorkerByID(t.Context(), orphan.WorkerID); !errors.Is(err, sqldb.ErrNotFound) {
		t.Fatalf("its worker row stays: %v", err)
	}
	if u := r.usage(acme.ID); len(u) != 0 {
		t.Fatalf("a VM never created is billed: %+v", u)
	}

	// The create-versus-list race: the next server is not listed for
	// two passes. Its row stays open and no second VM boots for it.
	r.demand.set(acme.ID, x86, 1)
	r.cloud.hideNext = 2
	r.pass()
	booted := r.rows(acme.ID)
	if len(booted) != 1 {
		t.Fatalf("%d rows, want 1", len(booted))
	}
	r.clock.Advance(time.Minute)
	r.pass()
	r.clock.Advance(time.Minute)
	r.pass()
	rows := r.rows(acme.ID)
	if len(rows) != 1 || rows[0].ID != booted[0].ID || len(r.cloud.serversOf(acme.ID)) != 1 {
		t.Fatalf("a VM the list did not show yet: rows %+v, %d servers; want its row kept and no second VM", rows, len(r.cloud.serversOf(acme.ID)))
	}

	// A VM deleted behind the proxy's back: its row closes as missing
	// once the list grace has passed, and its worker row goes.
	r.cloud.vanish(rows[0].ServerID)
	r.clock.Advance(time.Minute) // 3 min since the boot: the list grace
	r.pass()
	usage := r.usage(acme.ID)
	if len(usage) == 0 || usage[0].ID != rows[0].ID || usage[0].Outcome != proxystore.VMMissing || usage[0].BilledUnits != 1 {
		t.Fatalf("usage %+v, want the vanished VM's row closed as missing, billed 1 unit", usage)
	}
	if _, err := r.store.WorkerByID(t.Context(), rows[0].WorkerID); !errors.Is(err, sqldb.ErrNotFound) {
		t.Fatalf("the missing VM's token still opens a session: %v", err)
	}
	// The same pass booted its replacement: the demand is still there.
	if now := r.rows(acme.ID); len(now) != 1 || now[0].ID == rows[0].ID || len(r.cloud.serversOf(acme.ID)) != 1 {
		t.Fatalf("after the vanished VM: rows %+v, want one replacement", now)
	}
}

// A VM whose worker never connects is deleted at the boot deadline and
// ends as failed_boot without a bill; one that connected stays.
func TestBootDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	dead, live, stopped := r.tenant("dead"), r.tenant("live"), r.tenant("stopped")
	r.noWorkers(dead.ID)
	r.noWorkers(stopped.ID)
	r.demand.set(dead.ID, x86, 1)
	r.demand.set(live.ID, x86, 1)
	r.demand.set(stopped.ID, x86, 1)
	r.pass()
	r.waitConnected(live.ID, 1)
	// A tenant stopped while its VM boots: the VM drains, but it never
	// connected, so the boot deadline ends it unbilled.
	if _, err := r.store.SetTenantMayRun(t.Context(), stopped.ID, false); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(DefaultBootDeadline - time.Second)
	r.pass()
	if len(r.cloud.serversOf(dead.ID)) != 1 {
		t.Fatal("a VM was deleted before its boot deadline")
	}
	r.demand.set(dead.ID, x86, 0)
	r.clock.Advance(time.Second)
	r.pass()
	if n := len(r.cloud.serversOf(dead.ID)); n != 0 {
		t.Fatalf("a VM not connected at its boot deadline has %d servers", n)
	}
	usage := r.usage(dead.ID)
	if len(usage) != 1 || usage[0].Outcome != proxystore.VMFailedBoot || usage[0].BilledUnits != 0 || usage[0].DeletedAt == nil {
		t.Fatalf("usage %+v, want failed_boot with no bill", usage)
	}
	if ws, _ := r.store.Workers(t.Context(), dead.ID); len(ws) != 0 {
		t.Fatalf("the failed VM's worker row stays: %+v", ws)
	}
	if u := r.usage(stopped.ID); len(u) != 1 || u[0].Outcome != proxystore.VMFailedBoot || u[0].BilledUnits != 0 {
		t.Fatalf("the stopped tenant's VM that never connected: %+v, want failed_boot with no bill", u)
	}
	if len(r.cloud.serversOf(live.ID)) != 1 || len(r.rows(live.ID)) != 1 {
		t.Fatal("the connected VM was deleted at the boot deadline")
	}
}

// An idle VM goes only within the last 5 minutes of its billing unit,
// never while its worker is busy; it is billed the started units.
func TestScaleDownInTheBillingWindow(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	acme := r.tenant("acme")
	r.demand.set(acme.ID, x86, 4)
	r.pass()
	r.waitConnected(acme.ID, 2)
	rows := r.rows(acme.ID)
	busy := rows[0]
	r.sessions.setBusy(busy.WorkerID, true)
	r.demand.set(acme.ID, x86, 0)

	r.clock.Advance(30 * time.Minute)
	r.pass()
	if n := len(r.cloud.serversOf(acme.ID)); n != 2 {
		t.Fatalf("%d servers in the middle of the billing unit, want both kept", n)
	}
	r.clock.Advance(26 * time.Minute) // 56 min: the last 5
	r.pass()
	left := r.cloud.serversOf(acme.ID)
	if len(left) != 1 || left[0].ID != busy.ServerID {
		t.Fatalf("servers %v at 56 min, want only the busy one kept", left)
	}
	usage := r.usage(acme.ID)
	var ended proxystore.VMUsage
	for _, u := range usage {
		if !u.Outcome.Open() {
			ended = u
		}
	}
	if ended.Outcome != proxystore.VMDeleted || ended.BilledUnits != 1 {
		t.Fatalf("the idle VM's usage %+v, want deleted billed 1 unit", ended)
	}
	if r.sessions.Connected(ended.WorkerID) {
		waitfor.True(t, "the deleted VM's session closes", func() bool { return !r.sessions.Connected(ended.WorkerID) })
	}

	r.clock.Advance(5 * time.Minute) // 61 min: a new unit started
	r.sessions.setBusy(busy.WorkerID, false)
	r.pass()
	if len(r.cloud.serversOf(acme.ID)) != 1 {
		t.Fatal("an idle VM was deleted at the start of its second unit")
	}
	r.clock.Advance(55 * time.Minute) // 116 min
	r.pass()
	if len(r.cloud.serversOf(acme.ID)) != 0 {
		t.Fatal("the idle VM stays in its second unit's last window")
	}
	for _, u := range r.usage(acme.ID) {
		if u.ID == busy.ID && (u.Outcome != proxystore.VMDeleted || u.BilledUnits != 2) {
			t.Fatalf("the second VM's usage %+v, want deleted billed 2 units", u)
		}
	}
}

// A failing link drains the tenant's VMs (Draining to their sessions)
// and deletes them after the drain grace; no new VM boots meanwhile.
// A tenant that may not run is treated alike.
func TestDrainOnFailingLinkOrStoppedTenant(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	failing, stopped := r.tenant("failing"), r.tenant("stopped")
	r.demand.set(failing.ID, x86, 1)
	r.demand.set(stopped.ID, x86, 1)
	r.pass()
	r.waitConnected(failing.ID, 1)
	r.waitConnected(stopped.ID, 1)
	f, s := r.rows(failing.ID)[0], r.rows(stopped.ID)[0]

	if _, err := r.store.MarkLinkFailing(t.Context(), failing.ID, "token revoked"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.SetTenantMayRun(t.Context(), stopped.ID, false); err != nil {
		t.Fatal(err)
	}
	r.demand.set(failing.ID, x86, 5)
	r.pass()
	for _, row := range []proxystore.VMUsage{f, s} {
		if r.sessions.drains(row.WorkerID) == 0 {
			t.Fatalf("VM %d's session got no Draining", row.ServerID)
		}
		if r.cloud.server(row.ServerID) == nil {
			t.Fatalf("VM %d was deleted before the drain grace", row.ServerID)
		}
	}
	if n := len(r.cloud.serversOf(failing.ID)); n != 1 {
		t.Fatalf("a failing tenant with demand has %d servers, want no new one", n)
	}
	r.clock.Advance(DefaultDrainGrace - time.Second)
	r.pass()
	if r.cloud.server(f.ServerID) == nil || r.cloud.server(s.ServerID) == nil {
		t.Fatal("a draining VM was deleted before the drain grace")
	}
	r.clock.Advance(time.Second)
	r.pass()
	if r.cloud.server(f.ServerID) != nil || r.cloud.server(s.ServerID) != nil {
		t.Fatal("draining VMs stay after the drain grace")
	}
	for _, tn := range []proxystore.Tenant{failing, stopped} {
		u := r.usage(tn.ID)
		if len(u) != 1 || u[0].Outcome != proxystore.VMDrained || u[0].DrainingSince == nil || u[0].BilledUnits != 1 {
			t.Fatalf("%s usage %+v", tn.Name, u)
		}
	}
}

// A proxy restarted mid-run adopts its VMs: the running ones and the
// one whose creation the old process did not record. Nothing leaks,
// nothing boots twice, and the workers reconnect.
func TestRestartAdoptsVMs(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		r := newRig(t, dbURL)
		acme := r.tenant("acme")
		r.demand.set(acme.ID, x86, 6) // 3 VMs
		r.pass()
		r.waitConnected(acme.ID, 3)

		// The old process wrote a row and created the server, then
		// died before recording it: the row is still creating.
		r.demand.set(acme.ID, x86, 8) // 4 VMs, but max is 3 ...
		cfg, _ := r.store.HetznerConfig(t.Context(), acme.ID)
		cfg.MaxVMs = 4
		if _, err := r.store.SetHetznerConfig(t.Context(), acme.ID, cfg); err != nil {
			t.Fatal(err)
		}
		row, token, err := r.store.BeginVM(t.Context(), acme.ID, proxystore.NewVM{System: x86, ServerType: "cx22", Allowed: proxystore.Capabilities{Build: true}}, r.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		ud, _ := UserData(r.protoURL, row.WorkerID, token, 2)
		half := r.cloud.addServer(row.ServerName, map[string]string{LabelTenant: acme.ID, LabelVM: row.ID}, r.clock.Now())
		half.UserData = ud
		r.boot(half)

		r.restart()
		r.clock.Advance(time.Minute)
		creates := r.cloud.count("POST /servers")
		r.pass()
		r.waitConnected(acme.ID, 4)
		r.clock.Advance(DefaultBootDeadline + DefaultListGrace)
		r.pass()
		if got := r.cloud.count("POST /servers"); got != creates {
			t.Fatalf("the restarted proxy created %d servers", got-creates)
		}
		if got := r.cloud.count("DELETE /servers/{id}"); got != 0 {
			t.Fatalf("the restarted proxy deleted %d servers", got)
		}
		rows := r.rows(acme.ID)
		if len(rows) != 4 || len(r.cloud.serversOf(acme.ID)) != 4 {
			t.Fatalf("%d rows and %d servers after the restart, want 4 of each", len(rows), len(r.cloud.serversOf(acme.ID)))
		}
		for _, v := range rows {
			if v.Outcome != proxystore.VMRunning || v.ServerID == 0 || v.ConnectedAt == nil {
				t.Fatalf("row %+v after the restart", v)
			}
		}
	})
}

func TestUserDataRefusesInjection(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"ws://x/proto\n  - path: /etc/x", "ws://x/ proto", ""} {
		if _, err := UserData(bad, sqldb.NewID(), "token", 1); err == nil {
			t.Errorf("user data for proto URL %q", bad)
		}
	}
	ud, err := UserData("wss://proxy.example/proto", "w", "t", 3)
	if err != nil {
		t.Fatal(err)
	}
	env := parseEnv(t, ud)
	if env[EnvServerURL] != "wss://proxy.example/proto" || env[EnvWorkerID] != "w" || env[EnvPeers] != "w:t" || env[EnvMaxBuilds] != "3" {
		t.Fatalf("env %v", env)
	}
}

// A server type the API does not know fails the creation (client_error):
// nothing is billed or left behind, and the tenant backs off instead of
// asking again every pass.
func TestUnknownServerTypeLeavesNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	acme := r.tenant("acme")
	cfg, _ := r.store.HetznerConfig(t.Context(), acme.ID)
	cfg.Systems[x86] = proxystore.HetznerSystem{ServerType: "cx99", Slots: 1}
	if _, err := r.store.SetHetznerConfig(t.Context(), acme.ID, cfg); err != nil {
		t.Fatal(err)
	}
	r.demand.set(acme.ID, x86, 2)
	r.pass()
	r.pass()
	if got := r.cloud.createsOf(acme.ID); got != 1 {
		t.Fatalf("%d create calls, want 1 and then the backoff", got)
	}
	if r.apiCalls(opCreateServer, "client_error") != 1 {
		t.Fatal("the 422 is not counted as client_error")
	}
	if rows, ws, u := r.rows(acme.ID), must(r.store.Workers(t.Context(), acme.ID)), r.usage(acme.ID); len(rows)+len(ws)+len(u) != 0 {
		t.Fatalf("a failed creation left rows %+v, workers %+v, usage %+v", rows, ws, u)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A VM whose worker connected and then died is not kept while the
// demand holds the count at the target: once its worker has been gone
// for the boot deadline, the VM is deleted, its row ends as lost and
// billed for the time it ran, its token is revoked, and a new VM takes
// its place.
func TestLostWorkerRetiresItsVM(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	acme := r.tenant("acme")
	r.demand.set(acme.ID, x86, 1)
	r.pass()
	r.waitConnected(acme.ID, 1)
	first := r.rows(acme.ID)[0]
	r.clock.Advance(10 * time.Minute)
	r.crash(first.ServerID)
	waitfor.True(t, "the proxy sees the VM's worker gone", func() bool { return !r.sessions.Connected(first.WorkerID) })
	r.pass() // the worker is seen gone: its wait starts
	r.clock.Advance(DefaultBootDeadline - time.Second)
	r.pass()
	if s := r.cloud.serversOf(acme.ID); len(s) != 1 || s[0].ID != first.ServerID {
		t.Fatalf("servers %v: the VM went before its worker was gone for the boot deadline", s)
	}
	r.clock.Advance(time.Second)
	r.pass()
	var lost *proxystore.VMUsage
	for _, u := range r.usage(acme.ID) {
		if u.ID == first.ID {
			lost = &u
		}
	}
	if lost == nil || lost.Outcome != proxystore.VMLost || lost.BilledUnits != 1 || lost.DeletedAt == nil {
		t.Fatalf("the lost VM's row %+v, want lost with 1 billed unit", lost)
	}
	ws, err := r.store.Workers(t.Context(), acme.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.ID == first.WorkerID {
			t.Fatal("the lost VM's worker token was not revoked")
		}
	}
	s := r.cloud.serversOf(acme.ID)
	if len(s) != 1 || s[0].ID == first.ServerID {
		t.Fatalf("servers %v: want the lost VM deleted and one new VM for the demand", s)
	}
	r.waitConnected(acme.ID, 1)
	if got := testutil.ToFloat64(r.rec.m.actions.WithLabelValues("lost")); got != 1 {
		t.Fatalf("lost action counted %v times, want 1", got)
	}
}

// Bootable names the systems of an enabled configuration with room for
// a VM and tells BootableChanged when they change; a disabled tenant
// can boot nothing.
func TestBootableSystems(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	var mu sync.Mutex
	changed := map[string]int{}
	r.rec.cfg.BootableChanged = func(id string) { mu.Lock(); changed[id]++; mu.Unlock() }
	acme := r.tenant("acme")
	if got := r.rec.Bootable(acme.ID); got != nil {
		t.Fatalf("bootable before any pass: %v", got)
	}
	r.pass()
	if got := r.rec.Bootable(acme.ID); !slices.Equal(got, []string{x86}) {
		t.Fatalf("bootable %v, want [%s]", got, x86)
	}
	r.pass()
	cfg, err := r.store.HetznerConfig(t.Context(), acme.ID)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Systems["aarch64-linux"] = proxystore.HetznerSystem{ServerType: "cax11", Slots: 2}
	cfg.Systems["riscv64-linux"] = proxystore.HetznerSystem{ServerType: "cx22", Slots: 2} // no Hetzner machine
	if _, err := r.store.SetHetznerConfig(t.Context(), acme.ID, cfg); err != nil {
		t.Fatal(err)
	}
	r.pass()
	if got := r.rec.Bootable(acme.ID); !slices.Equal(got, []string{"aarch64-linux", x86}) {
		t.Fatalf("bootable %v, want aarch64-linux and %s", got, x86)
	}
	cfg.Enabled = false
	if _, err := r.store.SetHetznerConfig(t.Context(), acme.ID, cfg); err != nil {
		t.Fatal(err)
	}
	r.pass()
	if got := r.rec.Bootable(acme.ID); got != nil {
		t.Fatalf("a disabled tenant can boot %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if changed[acme.ID] != 3 {
		t.Fatalf("BootableChanged called %d times, want 3 (enabled, a system added, disabled)", changed[acme.ID])
	}
}
