package proxystore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb"
)

// A VM's token is bound to the first address that presents it: the same
// address is accepted again, another is refused, and a closed row
// accepts none. A worker that is no VM's is not bound at all.
func TestBindVMWorker(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		mustTenant(t, s, "acme")
		t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
		vm, _, err := s.BeginVM(ctx, "acme", testVM(), t0)
		if err != nil {
			t.Fatal(err)
		}
		if vm, err = s.VMCreated(ctx, vm.ID, 4711, t0); err != nil {
			t.Fatal(err)
		}
		b, err := s.BindVMWorker(ctx, vm.WorkerID, "")
		if err != nil || !b.VM || b.Accepted || b.BoundTo != "" {
			t.Fatalf("an unknown address: %+v, %v", b, err)
		}
		b, err = s.BindVMWorker(ctx, vm.WorkerID, "203.0.113.7")
		if err != nil || !b.VM || !b.Accepted || b.BoundTo != "203.0.113.7" {
			t.Fatalf("first handshake: %+v, %v", b, err)
		}
		if b, err = s.BindVMWorker(ctx, vm.WorkerID, "203.0.113.7"); err != nil || !b.Accepted {
			t.Fatalf("reconnect from the same address: %+v, %v", b, err)
		}
		if b, err = s.BindVMWorker(ctx, vm.WorkerID, "198.51.100.9"); err != nil || !b.VM || b.Accepted || b.BoundTo != "203.0.113.7" {
			t.Fatalf("another address: %+v, %v", b, err)
		}
		if open, _ := s.OpenVMs(ctx); len(open) != 1 || open[0].WorkerAddr != "203.0.113.7" {
			t.Fatalf("the row does not show its binding: %+v", open)
		}
		if _, err := s.EndVMUsage(ctx, vm.ID, VMDrained, t0.Add(time.Hour), 1); err != nil {
			t.Fatal(err)
		}
		if b, err = s.BindVMWorker(ctx, vm.WorkerID, "203.0.113.7"); err != nil || b.Accepted {
			t.Fatalf("a closed VM's token: %+v, %v", b, err)
		}

		w, _, err := s.CreateWorker(ctx, "acme", "laptop", Capabilities{Build: true})
		if err != nil {
			t.Fatal(err)
		}
		if b, err = s.BindVMWorker(ctx, w.ID, "203.0.113.7"); err != nil || b.VM {
			t.Fatalf("a worker of no VM: %+v, %v", b, err)
		}
		if b, err := s.BindVMWorker(ctx, w.ID, ""); err != nil || b.VM {
			t.Fatalf("a worker of no VM, no address: %+v, %v", b, err)
		}
		if _, err := s.BindVMWorker(ctx, w.ID, strings.Repeat("1", 65)); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("an address of 65 characters: %v", err)
		}
	})
}

// Two first handshakes from different addresses at once: exactly one
// binds the token.
func TestBindVMWorkerOnce(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		mustTenant(t, s, "acme")
		vm, _, err := s.BeginVM(ctx, "acme", testVM(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		addrs := []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"}
		results := make(chan VMBinding, len(addrs))
		for _, a := range addrs {
			go func() {
				b, err := s.BindVMWorker(ctx, vm.WorkerID, a)
				if err != nil {
					t.Error(err)
				}
				results <- b
			}()
		}
		accepted := 0
		for range addrs {
			if (<-results).Accepted {
				accepted++
			}
		}
		if accepted != 1 {
			t.Fatalf("%d of %d concurrent first handshakes were accepted, want 1", accepted, len(addrs))
		}
	})
}

// Failed boots count up per tenant and system with the retry time the
// caller's wait gives; a success ends the run; a deleted tenant's runs go.
func TestBootBackoff(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		acme := mustTenant(t, s, "acme")
		t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
		wait := func(n int) time.Duration { return time.Duration(n) * time.Minute }
		for i := 1; i <= 3; i++ {
			b, err := s.BootFailed(ctx, acme.ID, "x86_64-linux", t0, wait)
			if err != nil || b.Failures != i || !b.RetryAt.Equal(t0.Add(time.Duration(i)*time.Minute)) {
				t.Fatalf("failure %d: %+v, %v", i, b, err)
			}
		}
		if _, err := s.BootFailed(ctx, acme.ID, "aarch64-linux", t0, wait); err != nil {
			t.Fatal(err)
		}
		list, err := s.TenantBootBackoffs(ctx, "acme")
		if err != nil || len(list) != 2 || list[0].System != "aarch64-linux" || list[1].Failures != 3 {
			t.Fatalf("TenantBootBackoffs = %+v, %v", list, err)
		}
		if err := s.BootSucceeded(ctx, acme.ID, "x86_64-linux"); err != nil {
			t.Fatal(err)
		}
		if list, _ := s.BootBackoffs(ctx); len(list) != 1 || list[0].System != "aarch64-linux" {
			t.Fatalf("after a success: %+v", list)
		}
		if _, err := s.BootFailed(ctx, sqldb.NewID(), "x86_64-linux", t0, wait); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("an unknown tenant: %v", err)
		}
		if err := s.DeleteTenant(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
		if list, _ := s.BootBackoffs(ctx); len(list) != 0 {
			t.Fatalf("a deleted tenant's runs stay: %+v", list)
		}
	})
}
