package proxystore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb"
)

func TestTenants(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		b, err := s.CreateTenant(ctx, "beta")
		if err != nil {
			t.Fatal(err)
		}
		a, err := s.CreateTenant(ctx, "alpha")
		if err != nil {
			t.Fatal(err)
		}
		if !a.MayRun || a.CreatedAt.IsZero() {
			t.Fatalf("new tenant %+v: want may_run and a creation time", a)
		}
		if _, err := s.CreateTenant(ctx, "alpha"); !errors.Is(err, sqldb.ErrConflict) {
			t.Fatalf("duplicate name: err = %v, want ErrConflict", err)
		}
		for _, bad := range []string{"", "-x", "a b", strings.Repeat("n", 65), sqldb.NewID()} {
			if _, err := s.CreateTenant(ctx, bad); !errors.Is(err, sqldb.ErrInvalid) {
				t.Errorf("name %q: err = %v, want ErrInvalid", bad, err)
			}
		}

		list, err := s.Tenants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 || list[0].Name != "alpha" || list[1].Name != "beta" {
			t.Fatalf("Tenants = %+v, want alpha, beta", list)
		}
		for _, ref := range []string{"beta", b.ID, strings.ToUpper(b.ID)} {
			got, err := s.Tenant(ctx, ref)
			if err != nil || got.ID != b.ID {
				t.Fatalf("Tenant(%q) = %+v, %v", ref, got, err)
			}
		}
		if _, err := s.Tenant(ctx, "gamma"); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown tenant: err = %v", err)
		}

		off, err := s.SetTenantMayRun(ctx, "alpha", false)
		if err != nil || off.MayRun {
			t.Fatalf("SetTenantMayRun(false) = %+v, %v", off, err)
		}
		if got, _ := s.Tenant(ctx, a.ID); got.MayRun {
			t.Fatal("may_run not stored")
		}
		if on, err := s.SetTenantMayRun(ctx, a.ID, true); err != nil || !on.MayRun {
			t.Fatalf("SetTenantMayRun(true) = %+v, %v", on, err)
		}
		if _, err := s.SetTenantMayRun(ctx, "gamma", true); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown tenant: err = %v", err)
		}

		if err := s.DeleteTenant(ctx, "beta"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Tenant(ctx, b.ID); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("deleted tenant still found: %v", err)
		}
		if err := s.DeleteTenant(ctx, "beta"); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("second delete: err = %v", err)
		}
	})
}

func countRows(t *testing.T, s *Store, query string, args ...any) int {
	t.Helper()
	var n int
	if err := s.sql.QueryRowContext(t.Context(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDeleteTenantCascades(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		gone, kept := mustTenant(t, s, "gone"), mustTenant(t, s, "kept")
		for _, tenant := range []string{gone.ID, kept.ID} {
			mustLink(t, s, tenant)
			if _, _, err := s.CreateWorker(ctx, tenant, "w1", Capabilities{Build: true}); err != nil {
				t.Fatal(err)
			}
		}
		vm, _, err := s.BeginVM(ctx, gone.ID, testVM(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTenant(ctx, gone.ID); !errors.Is(err, sqldb.ErrConflict) {
			t.Fatalf("delete with a VM being created: err = %v, want ErrConflict", err)
		}
		if _, err := s.VMCreated(ctx, vm.ID, 4711, time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTenant(ctx, gone.ID); !errors.Is(err, sqldb.ErrConflict) {
			t.Fatalf("delete with a running VM: err = %v, want ErrConflict", err)
		}
		if _, err := s.EndVMUsage(ctx, vm.ID, VMDeleted, time.Now(), 1); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTenant(ctx, gone.ID); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"upstream_links", "upstream_link_tokens", "authorized_workers"} {
			if n := countRows(t, s, `SELECT COUNT(*) FROM `+table+` WHERE tenant_id = $1`, gone.ID); n != 0 {
				t.Errorf("%s keeps %d rows of the deleted tenant", table, n)
			}
			if n := countRows(t, s, `SELECT COUNT(*) FROM `+table+` WHERE tenant_id = $1`, kept.ID); n == 0 {
				t.Errorf("%s lost the other tenant's rows", table)
			}
		}
		if n := countRows(t, s, `SELECT COUNT(*) FROM vm_usage WHERE tenant_id = $1 AND tenant_name = 'gone'`, gone.ID); n != 1 {
			t.Fatalf("the deleted tenant's VM usage (its bill) has %d rows, want 1", n)
		}
	})
}

func mustTenant(t *testing.T, s *Store, name string) Tenant {
	t.Helper()
	tenant, err := s.CreateTenant(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return tenant
}
