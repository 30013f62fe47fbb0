package proxystore

import (
	"errors"
	"testing"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb"
)

func testVM() VMUsage {
	return VMUsage{ServerID: 4711, ServerName: "gradient-acme-1", System: "x86_64-linux", ServerType: "cx22", WorkerID: sqldb.NewID()}
}

func TestVMUsage(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		acme := mustTenant(t, s, "acme")
		first, err := s.StartVMUsage(ctx, "acme", testVM())
		if err != nil {
			t.Fatal(err)
		}
		if first.TenantID != acme.ID || first.TenantName != "acme" || first.Outcome != VMRunning || first.DeletedAt != nil || first.ServerID != 4711 {
			t.Fatalf("started %+v", first)
		}
		second, err := s.StartVMUsage(ctx, acme.ID, testVM())
		if err != nil {
			t.Fatal(err)
		}

		ended, err := s.EndVMUsage(ctx, first.ID, VMDeleted)
		if err != nil || ended.Outcome != VMDeleted || ended.DeletedAt == nil || ended.DeletedAt.Before(ended.CreatedAt) {
			t.Fatalf("EndVMUsage = %+v, %v", ended, err)
		}
		if _, err := s.EndVMUsage(ctx, first.ID, VMFailedBoot); !errors.Is(err, sqldb.ErrConflict) {
			t.Fatalf("ending twice: err = %v, want ErrConflict", err)
		}
		if _, err := s.EndVMUsage(ctx, second.ID, VMRunning); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("ending as running: err = %v, want ErrInvalid", err)
		}
		if _, err := s.EndVMUsage(ctx, second.ID, VMFailedBoot); err != nil {
			t.Fatal(err)
		}
		if _, err := s.EndVMUsage(ctx, sqldb.NewID(), VMDeleted); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown row: err = %v, want ErrNotFound", err)
		}

		list, err := s.VMUsages(ctx, "acme")
		if err != nil || len(list) != 2 {
			t.Fatalf("VMUsages = %+v, %v", list, err)
		}
		outcomes := map[string]VMOutcome{list[0].ID: list[0].Outcome, list[1].ID: list[1].Outcome}
		if outcomes[first.ID] != VMDeleted || outcomes[second.ID] != VMFailedBoot || list[1].DeletedAt == nil {
			t.Fatalf("VMUsages = %+v", list)
		}

		bad := testVM()
		bad.System = ""
		if _, err := s.StartVMUsage(ctx, "acme", bad); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("no system: err = %v, want ErrInvalid", err)
		}
		bad = testVM()
		bad.WorkerID = "w"
		if _, err := s.StartVMUsage(ctx, "acme", bad); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("bad worker ID: err = %v, want ErrInvalid", err)
		}
		if _, err := s.StartVMUsage(ctx, "nobody", testVM()); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown tenant: err = %v, want ErrNotFound", err)
		}
	})
}
