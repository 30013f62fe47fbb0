package hetzner

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// A drained tenant's VM whose worker stays away (a drained worker
// reconnects with backoff, or not at all) for far longer than the boot
// deadline is not deleted as lost: it ends as drained after the drain
// grace, as in the report (drain grace 40 s, boot deadline 8 s).
func TestDrainedVMAwayEndsDrainedNotLost(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	r.rec.cfg.BootDeadline, r.rec.cfg.DrainGrace = 8*time.Second, 40*time.Second
	acme := r.tenant("acme")
	r.demand.set(acme.ID, x86, 1)
	r.pass()
	r.waitConnected(acme.ID, 1)
	vm := r.rows(acme.ID)[0]

	if _, err := r.store.SetTenantMayRun(t.Context(), acme.ID, false); err != nil {
		t.Fatal(err)
	}
	r.pass() // may-run off: the VM drains
	if r.sessions.drains(vm.WorkerID) == 0 {
		t.Fatal("the VM's session got no Draining")
	}
	r.crash(vm.ServerID)
	waitfor.True(t, "the proxy sees the drained VM's worker gone", func() bool { return !r.sessions.Connected(vm.WorkerID) })
	for elapsed := 4 * time.Second; elapsed < 40*time.Second; elapsed += 4 * time.Second {
		r.clock.Advance(4 * time.Second)
		r.pass()
		if r.cloud.server(vm.ServerID) == nil {
			t.Fatalf("the draining VM was deleted %s after may-run off, before its drain grace: %+v", elapsed, r.usage(acme.ID))
		}
	}
	r.clock.Advance(4 * time.Second) // 40 s: the grace ended
	r.pass()
	if r.cloud.server(vm.ServerID) != nil {
		t.Fatal("the draining VM stays after its drain grace")
	}
	u := r.usage(acme.ID)
	if len(u) != 1 || u[0].Outcome != proxystore.VMDrained || u[0].BilledUnits != 1 {
		t.Fatalf("usage %+v, want the VM drained (not lost), billed 1 unit", u)
	}
	if got := testutil.ToFloat64(r.rec.m.actions.WithLabelValues("lost")); got != 0 {
		t.Fatalf("lost counted %v times", got)
	}
}

// A snapshot that never boots: each failed boot doubles the wait before
// the system's next VM (from the boot deadline up to the cap), so the
// VMs created over N passes grow with log N, not N/(boot deadline). A VM
// that connects ends the backoff.
func TestFailedBootsBackOff(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	const step = time.Minute
	r.rec.cfg.BootBackoffMax = 80 * time.Minute
	acme := r.tenant("acme")
	r.noWorkers(acme.ID)
	r.demand.set(acme.ID, x86, 4) // 2 VMs wanted
	var createdAt []int           // the pass of each creation
	const passes = 400
	for i := range passes {
		before := r.cloud.createsOf(acme.ID)
		r.pass()
		for range r.cloud.createsOf(acme.ID) - before {
			createdAt = append(createdAt, i)
		}
		r.clock.Advance(step)
	}
	// Without a backoff: 2 VMs every boot deadline, 160 in 400 passes.
	// With it: the first 2, then one probe at a time after waits of 10
	// (2·5: two failures at once), 20, 40, 80, 80, ... minutes after
	// each failure, a failure being seen 5 minutes after its creation.
	want := []int{0, 0}
	for at, wait := 5, 10; ; wait = min(2*wait, 80) {
		next := at + wait
		if next >= passes {
			break
		}
		want = append(want, next)
		at = next + 5
	}
	if len(createdAt) != len(want) {
		t.Fatalf("%d VMs created in %d passes at passes %v, want %d at %v", len(createdAt), passes, createdAt, len(want), want)
	}
	for i := range want {
		if createdAt[i] != want[i] {
			t.Fatalf("VMs created at passes %v, want %v", createdAt, want)
		}
	}
	b, err := r.store.TenantBootBackoffs(t.Context(), acme.ID)
	if err != nil || len(b) != 1 || b[0].Failures < len(want)-1 {
		t.Fatalf("boot backoffs %+v, %v", b, err)
	}
	if got := testutil.ToFloat64(r.rec.m.failedBoots.WithLabelValues("acme", x86)); int(got) != b[0].Failures {
		t.Fatalf("failed boots gauge %v, want %d", got, b[0].Failures)
	}

	// The snapshot is fixed: the next probe connects and the backoff ends.
	r.mu.Lock()
	r.dead[acme.ID] = false
	r.mu.Unlock()
	r.clock.Advance(b[0].RetryAt.Sub(r.clock.Now()))
	r.pass()
	probe := r.rows(acme.ID)
	if len(probe) != 1 {
		t.Fatalf("rows %+v, want one probe", probe)
	}
	waitfor.True(t, "the probe's worker connects", func() bool { return r.sessions.Connected(probe[0].WorkerID) })
	r.pass() // sees it connected, ends the backoff and boots the second VM at once
	if b, _ := r.store.TenantBootBackoffs(t.Context(), acme.ID); len(b) != 0 {
		t.Fatalf("a connected VM left the backoff %+v", b)
	}
	if n := len(r.rows(acme.ID)); n != 2 {
		t.Fatalf("%d VMs after a good boot, want 2", n)
	}
	if got := testutil.CollectAndCount(r.rec.m.failedBoots); got != 0 {
		t.Fatalf("%d failed boots series after the backoff ended", got)
	}
}
