package proxystore

import (
	"errors"
	"slices"
	"testing"
	"time"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage/sqldb"
)

func testVM() NewVM {
	return NewVM{System: "x86_64-linux", ServerType: "cx22", Location: "fsn1", Allowed: Capabilities{Build: true}}
}

func TestVMLifecycle(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		acme := mustTenant(t, s, "acme")
		t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
		vm, token, err := s.BeginVM(ctx, "acme", testVM(), t0)
		if err != nil {
			t.Fatal(err)
		}
		if vm.TenantID != acme.ID || vm.Outcome != VMCreating || vm.ServerID != 0 || vm.ServerName != "gradient-"+vm.ID {
			t.Fatalf("begun %+v", vm)
		}
		// The VM's worker row exists with only the token's hash, and
		// the usage period does not show a VM that is not created yet.
		w, err := s.WorkerByID(ctx, vm.WorkerID)
		if err != nil || w.TenantID != acme.ID || w.Allowed != (Capabilities{Build: true}) || !secret.Verify(w.TokenHash, token) {
			t.Fatalf("worker row %+v, %v", w, err)
		}
		if list, _ := s.VMUsages(ctx, "acme"); len(list) != 0 {
			t.Fatalf("a creating row is billed: %+v", list)
		}
		if open, _ := s.OpenVMs(ctx); len(open) != 1 || open[0].ID != vm.ID {
			t.Fatalf("OpenVMs = %+v", open)
		}

		created := t0.Add(3 * time.Second)
		if vm, err = s.VMCreated(ctx, vm.ID, 4711, created); err != nil || vm.Outcome != VMRunning || !vm.CreatedAt.Equal(created) {
			t.Fatalf("VMCreated = %+v, %v", vm, err)
		}
		if _, err := s.VMCreated(ctx, vm.ID, 4711, created); !errors.Is(err, sqldb.ErrConflict) {
			t.Fatalf("created twice: %v", err)
		}
		if err := s.AbandonVM(ctx, vm.ID); !errors.Is(err, sqldb.ErrConflict) {
			t.Fatalf("abandoning a running VM: %v", err)
		}
		conn := created.Add(time.Minute)
		s.MarkVMConnected(ctx, vm.ID, conn)
		if vm, err = s.MarkVMConnected(ctx, vm.ID, conn.Add(time.Hour)); err != nil || !vm.ConnectedAt.Equal(conn) {
			t.Fatalf("connected again: %+v, %v", vm, err)
		}
		if vm, err = s.MarkVMDraining(ctx, vm.ID, conn); err != nil || !vm.DrainingSince.Equal(conn) {
			t.Fatalf("MarkVMDraining = %+v, %v", vm, err)
		}

		if _, err := s.EndVMUsage(ctx, vm.ID, VMFailedBoot, conn, 1); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("a failed boot with a bill: %v", err)
		}
		if _, err := s.EndVMUsage(ctx, vm.ID, VMRunning, conn, 0); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("ending as running: %v", err)
		}
		end := created.Add(70 * time.Minute)
		ended, err := s.EndVMUsage(ctx, vm.ID, VMDeleted, end, 2)
		if err != nil || ended.Outcome != VMDeleted || !ended.DeletedAt.Equal(end) || ended.BilledUnits != 2 {
			t.Fatalf("EndVMUsage = %+v, %v", ended, err)
		}
		if _, err := s.WorkerByID(ctx, vm.WorkerID); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("the deleted VM's worker row stays: %v", err)
		}
		if _, err := s.EndVMUsage(ctx, vm.ID, VMMissing, end, 0); !errors.Is(err, sqldb.ErrConflict) {
			t.Fatalf("ending twice: %v", err)
		}
		if _, err := s.EndVMUsage(ctx, sqldb.NewID(), VMDeleted, end, 0); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown row: %v", err)
		}

		// A failed creation leaves neither row.
		gone, _, err := s.BeginVM(ctx, acme.ID, testVM(), t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.AbandonVM(ctx, gone.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WorkerByID(ctx, gone.WorkerID); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("an abandoned VM's worker row stays: %v", err)
		}
		if open, _ := s.OpenVMs(ctx); len(open) != 0 {
			t.Fatalf("OpenVMs = %+v", open)
		}

		// A lost VM's row (migration 3) ends billed, its worker row
		// gone, and keeps its connection time.
		lost, _, err := s.BeginVM(ctx, acme.ID, testVM(), t0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.VMCreated(ctx, lost.ID, 4712, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MarkVMConnected(ctx, lost.ID, t0.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if ended, err := s.EndVMUsage(ctx, lost.ID, VMLost, t0.Add(20*time.Minute), 1); err != nil ||
			ended.Outcome != VMLost || ended.BilledUnits != 1 || ended.ConnectedAt == nil {
			t.Fatalf("ending as lost: %+v, %v", ended, err)
		}
		if _, err := s.WorkerByID(ctx, lost.WorkerID); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("the lost VM's worker row stays: %v", err)
		}
		if list, _ := s.VMUsages(ctx, "acme"); !slices.ContainsFunc(list, func(v VMUsage) bool { return v.ID == lost.ID && v.Outcome == VMLost }) {
			t.Fatalf("usage %+v lacks the lost VM", list)
		}

		bad := testVM()
		bad.System = ""
		if _, _, err := s.BeginVM(ctx, "acme", bad, t0); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("no system: err = %v, want ErrInvalid", err)
		}
		if _, _, err := s.BeginVM(ctx, "nobody", testVM(), t0); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown tenant: err = %v, want ErrNotFound", err)
		}
	})
}

func TestVMUsagesBetween(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		mustTenant(t, s, "acme")
		mustTenant(t, s, "other")
		day := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
		vm := func(tenant string, from, to time.Time) string {
			v, _, err := s.BeginVM(ctx, tenant, testVM(), from)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.VMCreated(ctx, v.ID, 1, from); err != nil {
				t.Fatal(err)
			}
			if !to.IsZero() {
				if _, err := s.EndVMUsage(ctx, v.ID, VMDeleted, to, 1); err != nil {
					t.Fatal(err)
				}
			}
			return v.ID
		}
		before := vm("acme", day.Add(-2*time.Hour), day.Add(-time.Hour))
		across := vm("acme", day.Add(-time.Hour), day.Add(time.Hour))
		inside := vm("acme", day.Add(2*time.Hour), day.Add(3*time.Hour))
		running := vm("acme", day.Add(4*time.Hour), time.Time{})
		vm("other", day, day.Add(time.Hour))
		list, err := s.VMUsagesBetween(ctx, "acme", day, day.Add(24*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, v := range list {
			ids = append(ids, v.ID)
		}
		if len(ids) != 3 || ids[0] != across || ids[1] != inside || ids[2] != running {
			t.Fatalf("the day's VMs %v, want %v", ids, []string{across, inside, running})
		}
		if all, _ := s.VMUsages(ctx, "acme"); len(all) != 4 || all[0].ID != before {
			t.Fatalf("VMUsages = %+v", all)
		}
		if _, err := s.VMUsagesBetween(ctx, "acme", day, day.Add(-time.Hour)); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("a period ending before it starts: %v", err)
		}
	})
}
