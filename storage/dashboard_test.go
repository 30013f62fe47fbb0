package storage

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A scoped token is found by its text and nothing else; revoking it ends
// the sessions it opened.
func TestAPITokensAndSessions(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		tok, text, err := db.CreateAPIToken(ctx, "ci reader", ScopeRead)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(text, APITokenPrefix) {
			t.Fatalf("token text %q lacks its prefix", text)
		}
		got, err := db.APITokenByText(ctx, text)
		if err != nil || got.ID != tok.ID || got.Scope != ScopeRead || got.Name != "ci reader" {
			t.Fatalf("lookup: %+v, %v", got, err)
		}
		for _, wrong := range []string{"", text + "x", strings.TrimPrefix(text, APITokenPrefix), APITokenPrefix} {
			if _, err := db.APITokenByText(ctx, wrong); !errors.Is(err, ErrNotFound) {
				t.Fatalf("wrong token %q: %v", wrong, err)
			}
		}
		if _, _, err := db.CreateAPIToken(ctx, "x", "root"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("unknown scope: %v", err)
		}
		var stored string
		if err := db.sql.QueryRowContext(ctx, `SELECT token_digest FROM api_tokens WHERE id = $1`, tok.ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(text, stored) || len(stored) != 64 {
			t.Fatalf("stored %q: want the SHA-256 only", stored)
		}

		id, s, err := db.CreateDashboardSession(ctx, tok.Scope, tok.ID, time.Hour)
		if err != nil || s.Scope != ScopeRead {
			t.Fatalf("session: %+v, %v", s, err)
		}
		if got, err := db.DashboardSessionByID(ctx, id); err != nil || got.TokenID != tok.ID {
			t.Fatalf("session lookup: %+v, %v", got, err)
		}
		expired, _, err := db.CreateDashboardSession(ctx, ScopeAdmin, "", -time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.DashboardSessionByID(ctx, expired); !errors.Is(err, ErrNotFound) {
			t.Fatalf("expired session: %v", err)
		}
		if err := db.DeleteAPIToken(ctx, tok.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.DashboardSessionByID(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("session of a revoked token: %v", err)
		}
		if _, err := db.APITokenByText(ctx, text); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoked token: %v", err)
		}
		admin, _, err := db.CreateDashboardSession(ctx, ScopeAdmin, "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteDashboardSession(ctx, admin); err != nil {
			t.Fatal(err)
		}
		if _, err := db.DashboardSessionByID(ctx, admin); !errors.Is(err, ErrNotFound) {
			t.Fatalf("logged-out session: %v", err)
		}
	})
}

func TestProjectPublic(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		p := mustProject(t, db, mustTeam(t, db, "t").ID, "p").ID
		for _, on := range []bool{true, true, false} {
			if err := db.SetProjectPublic(ctx, p, on); err != nil {
				t.Fatal(err)
			}
			if got, err := db.ProjectPublic(ctx, p); err != nil || got != on {
				t.Fatalf("public %v, %v; want %v", got, err, on)
			}
		}
		if err := db.SetProjectPublic(ctx, NewID(), true); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown project: %v", err)
		}
	})
}
