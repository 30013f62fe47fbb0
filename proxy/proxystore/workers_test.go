package proxystore

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage/sqldb"
)

func TestWorkers(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		acme, other := mustTenant(t, s, "acme"), mustTenant(t, s, "other")
		allowed := Capabilities{Fetch: true, Build: true}
		w, token, err := s.CreateWorker(ctx, "acme", "builder-1", allowed)
		if err != nil {
			t.Fatal(err)
		}
		if w.TenantID != acme.ID || w.Name != "builder-1" || w.Allowed != allowed || w.CreatedAt.IsZero() {
			t.Fatalf("worker %+v", w)
		}
		if _, err := sqldb.CanonicalUUID("id", w.ID); err != nil {
			t.Fatal(err)
		}
		if len(token) != 64 || !secret.Verify(w.TokenHash, token) || secret.Verify(w.TokenHash, token[1:]+"x") {
			t.Fatal("the token shown does not match its stored hash, or another one does")
		}

		// Only the argon2id hash reaches the database.
		var stored string
		if err := s.sql.QueryRowContext(ctx, `SELECT token_hash FROM authorized_workers WHERE worker_id = $1`, w.ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(stored, "$argon2id$") || strings.Contains(stored, token) {
			t.Fatalf("stored token %q is not an argon2id hash", stored)
		}
		if n := countRows(t, s, `SELECT COUNT(*) FROM authorized_workers WHERE name = $1 OR token_hash = $1 OR worker_id = $1`, token); n != 0 {
			t.Fatal("a column holds the token")
		}
		if view, _ := json.Marshal(w); strings.Contains(string(view), stored) || strings.Contains(string(view), "argon2") {
			t.Fatalf("the worker's view shows its hash: %s", view)
		}

		if _, _, err := s.CreateWorker(ctx, acme.ID, "builder-1", allowed); !errors.Is(err, sqldb.ErrConflict) {
			t.Fatalf("duplicate name in a tenant: err = %v, want ErrConflict", err)
		}
		w2, token2, err := s.CreateWorker(ctx, "other", "builder-1", Capabilities{Eval: true})
		if err != nil {
			t.Fatalf("the same name in another tenant: %v", err)
		}
		if w2.ID == w.ID || token2 == token {
			t.Fatal("two workers share an ID or a token")
		}
		if _, _, err := s.CreateWorker(ctx, "acme", "idle", Capabilities{}); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("nothing allowed: err = %v, want ErrInvalid", err)
		}
		if _, _, err := s.CreateWorker(ctx, "acme", "bad name", allowed); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("bad name: err = %v, want ErrInvalid", err)
		}
		if _, _, err := s.CreateWorker(ctx, "nobody", "w", allowed); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown tenant: err = %v, want ErrNotFound", err)
		}
		if _, _, err := s.CreateWorker(ctx, "acme", "analyst", Capabilities{Eval: true}); err != nil {
			t.Fatal(err)
		}

		list, err := s.Workers(ctx, "acme")
		if err != nil || len(list) != 2 || list[0].Name != "analyst" || list[1].ID != w.ID {
			t.Fatalf("Workers(acme) = %+v, %v", list, err)
		}
		if list, err := s.Workers(ctx, other.ID); err != nil || len(list) != 1 || list[0].ID != w2.ID {
			t.Fatalf("Workers(other) = %+v, %v", list, err)
		}
		got, err := s.WorkerByID(ctx, strings.ToUpper(w.ID))
		if err != nil || got.ID != w.ID || got.TokenHash != w.TokenHash || got.Allowed != allowed || got.TenantID != acme.ID {
			t.Fatalf("WorkerByID = %+v, %v", got, err)
		}
		if _, err := s.WorkerByID(ctx, "not-a-uuid"); !errors.Is(err, sqldb.ErrInvalid) {
			t.Fatalf("bad ID: err = %v", err)
		}

		if err := s.DeleteWorker(ctx, w.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WorkerByID(ctx, w.ID); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("a revoked worker is still found: %v", err)
		}
		if err := s.DeleteWorker(ctx, w.ID); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("second revoke: err = %v, want ErrNotFound", err)
		}
		if _, err := s.WorkerByID(ctx, w2.ID); err != nil {
			t.Fatalf("revoking one worker touched another: %v", err)
		}
	})
}

func TestParseCapabilities(t *testing.T) {
	tests := []struct {
		in   string
		want Capabilities
		err  string
	}{
		{in: "fetch,eval,build", want: Capabilities{true, true, true}},
		{in: " Build , fetch ", want: Capabilities{Fetch: true, Build: true}},
		{in: "eval,", want: Capabilities{Eval: true}},
		{in: "build,federate", err: "federate is never granted"},
		{in: "cache", err: `unknown capability "cache"`},
		{in: "", err: "no capability"},
	}
	for _, tt := range tests {
		got, err := ParseCapabilities(tt.in)
		if tt.err != "" {
			if !errors.Is(err, sqldb.ErrInvalid) || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err = %v, want ErrInvalid containing %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%q = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
		if again, err := ParseCapabilities(got.String()); err != nil || again != got {
			t.Errorf("%q: String %q does not read back", tt.in, got.String())
		}
	}
}
