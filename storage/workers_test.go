package storage

import (
	"database/sql"
	"errors"
	"reflect"
	"strings"
	"testing"

	"gradient.dev/gradient/secret"
)

func TestRegistrations(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		project := mustProject(t, db, team.ID, "web")
		cache := mustCache(t, db, "main")
		worker := NewID()
		projectPeer := Peer{PeerProject, project.ID}

		reg, token, err := db.CreateRegistration(ctx, projectPeer, strings.ToUpper(worker), DefaultWorkerSettings())
		if err != nil {
			t.Fatal(err)
		}
		if reg.WorkerID != worker {
			t.Fatalf("worker ID %q not canonicalised to %q", reg.WorkerID, worker)
		}
		if !strings.HasPrefix(reg.TokenHash, "$argon2id$") || !secret.Verify(reg.TokenHash, token) {
			t.Fatalf("token does not verify against the stored hash %q", reg.TokenHash)
		}
		if _, _, err := db.CreateRegistration(ctx, projectPeer, worker, DefaultWorkerSettings()); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate registration: err = %v, want ErrConflict", err)
		}
		// Several peers may register one worker ID.
		dialed := WorkerSettings{URL: "wss://worker.example.com/proto", EnableBuild: true}
		if _, _, err := db.CreateRegistration(ctx, Peer{PeerCache, cache.ID}, worker, dialed); err != nil {
			t.Fatal(err)
		}
		proxy := Peer{PeerProxy, NewID()}
		if _, _, err := db.CreateRegistration(ctx, proxy, worker, DefaultWorkerSettings()); err != nil {
			t.Fatalf("proxy registration: %v", err)
		}

		for _, tt := range []struct {
			name string
			peer Peer
			id   string
			s    WorkerSettings
			want error
		}{
			{"unknown project", Peer{PeerProject, NewID()}, NewID(), DefaultWorkerSettings(), ErrNotFound},
			{"unknown cache", Peer{PeerCache, NewID()}, NewID(), DefaultWorkerSettings(), ErrNotFound},
			{"unknown peer kind", Peer{"team", project.ID}, NewID(), DefaultWorkerSettings(), ErrInvalid},
			{"worker ID not a UUID", projectPeer, "worker-1", DefaultWorkerSettings(), ErrInvalid},
			{"http URL", projectPeer, NewID(), WorkerSettings{URL: "http://x"}, ErrInvalid},
		} {
			if _, _, err := db.CreateRegistration(ctx, tt.peer, tt.id, tt.s); !errors.Is(err, tt.want) {
				t.Fatalf("%s: err = %v, want %v", tt.name, err, tt.want)
			}
		}

		regs, err := db.RegistrationsOfWorker(ctx, worker)
		if err != nil || len(regs) != 3 {
			t.Fatalf("RegistrationsOfWorker = %+v, %v", regs, err)
		}
		byKind := map[PeerKind]Registration{}
		for _, r := range regs {
			byKind[r.Peer.Kind] = r
		}
		if got := byKind[PeerCache]; got.WorkerSettings != dialed || got.Peer.ID != cache.ID {
			t.Fatalf("cache registration = %+v", got)
		}
		if got := byKind[PeerProject]; got.WorkerSettings != DefaultWorkerSettings() || got.URL != "" {
			t.Fatalf("project registration = %+v", got)
		}

		listed, err := db.ListPeerRegistrations(ctx, projectPeer)
		if err != nil || len(listed) != 1 || listed[0].WorkerID != worker {
			t.Fatalf("ListPeerRegistrations = %+v, %v", listed, err)
		}
		update := WorkerSettings{URL: "ws://127.0.0.1:9000/proto", EnableFetch: true}
		if err := db.UpdateRegistration(ctx, projectPeer, worker, update); err != nil {
			t.Fatal(err)
		}
		got, err := db.Registration(ctx, projectPeer, worker)
		if err != nil || got.WorkerSettings != update || got.TokenHash != reg.TokenHash {
			t.Fatalf("after update: %+v, %v", got, err)
		}
		rotated, err := db.RotateRegistrationToken(ctx, projectPeer, worker)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := db.Registration(ctx, projectPeer, worker); !secret.Verify(got.TokenHash, rotated) || secret.Verify(got.TokenHash, token) {
			t.Fatal("after rotation the new token must verify and the old one must not")
		}
		if _, err := db.RotateRegistrationToken(ctx, projectPeer, NewID()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("rotate unknown: err = %v", err)
		}
		if err := db.UpdateRegistration(ctx, projectPeer, NewID(), update); !errors.Is(err, ErrNotFound) {
			t.Fatalf("update unknown: err = %v", err)
		}
		if err := db.DeleteRegistration(ctx, projectPeer, worker); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Registration(ctx, projectPeer, worker); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted registration: err = %v", err)
		}
		if err := db.DeleteRegistration(ctx, projectPeer, worker); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete twice: err = %v", err)
		}
	})
}

func TestTeamWorkers(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "builders")
		worker := NewID()
		w, token, err := db.CreateTeamWorker(ctx, team.ID, worker, DefaultWorkerSettings())
		if err != nil {
			t.Fatal(err)
		}
		if !secret.Verify(w.TokenHash, token) || w.TeamID != team.ID {
			t.Fatalf("team worker %+v does not verify its token", w)
		}
		if _, _, err := db.CreateTeamWorker(ctx, team.ID, worker, DefaultWorkerSettings()); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate team worker: err = %v, want ErrConflict", err)
		}
		if _, _, err := db.CreateTeamWorker(ctx, NewID(), NewID(), DefaultWorkerSettings()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown team: err = %v, want ErrNotFound", err)
		}
		got, err := db.TeamWorker(ctx, worker)
		if err != nil || !reflect.DeepEqual(got, w) {
			t.Fatalf("TeamWorker = %+v, %v; want %+v", got, err, w)
		}
		settings := WorkerSettings{URL: "wss://builder.example.com/proto", EnableBuild: true}
		if err := db.UpdateTeamWorker(ctx, worker, settings); err != nil {
			t.Fatal(err)
		}
		list, err := db.ListTeamWorkers(ctx, team.ID)
		if err != nil || len(list) != 1 || list[0].WorkerSettings != settings {
			t.Fatalf("ListTeamWorkers = %+v, %v", list, err)
		}
		rotated, err := db.RotateTeamWorkerToken(ctx, worker)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := db.TeamWorker(ctx, worker); !secret.Verify(got.TokenHash, rotated) || secret.Verify(got.TokenHash, token) {
			t.Fatal("after rotation the new token must verify and the old one must not")
		}
		if err := db.DeleteTeamWorker(ctx, worker); err != nil {
			t.Fatal(err)
		}
		if _, err := db.TeamWorker(ctx, worker); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted team worker: err = %v", err)
		}
		if err := db.DeleteTeamWorker(ctx, worker); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete twice: err = %v", err)
		}
	})
}

func TestWorkerIDBelongsToRegistrationsOrOneTeamWorker(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		other := mustTeam(t, db, "b")
		project := mustProject(t, db, team.ID, "web")
		peer := Peer{PeerProject, project.ID}
		const rule = "Gradient.CI worker IDs belong to one registration or team worker only"

		registered := NewID()
		if _, _, err := db.CreateRegistration(ctx, peer, registered, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		_, _, err := db.CreateTeamWorker(ctx, team.ID, registered, DefaultWorkerSettings())
		if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), rule) {
			t.Fatalf("team worker reusing a registered ID: err = %v", err)
		}

		teamWorker := NewID()
		if _, _, err := db.CreateTeamWorker(ctx, team.ID, teamWorker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		_, _, err = db.CreateRegistration(ctx, peer, teamWorker, DefaultWorkerSettings())
		if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), rule) {
			t.Fatalf("registration reusing a team worker's ID: err = %v", err)
		}
		if _, _, err := db.CreateTeamWorker(ctx, other.ID, teamWorker, DefaultWorkerSettings()); !errors.Is(err, ErrConflict) {
			t.Fatalf("one worker ID in two teams: err = %v", err)
		}

		// Deleting the credentials frees the ID for the other kind.
		if err := db.DeleteRegistration(ctx, peer, registered); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.CreateTeamWorker(ctx, team.ID, registered, DefaultWorkerSettings()); err != nil {
			t.Fatalf("team worker after the registration was deleted: %v", err)
		}
		if err := db.DeleteTeamWorker(ctx, teamWorker); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.CreateRegistration(ctx, peer, teamWorker, DefaultWorkerSettings()); err != nil {
			t.Fatalf("registration after the team worker was deleted: %v", err)
		}
	})
}

// The database rejects a second kind of owner even when the Go check is
// bypassed, so a race between two creates cannot break the rule.
func TestWorkerIDRuleIsEnforcedBySchema(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		worker := NewID()
		if _, _, err := db.CreateTeamWorker(ctx, team.ID, worker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		_, err := db.sql.ExecContext(ctx,
			`INSERT INTO worker_registrations (peer_kind, peer_id, worker_id, token_hash, created_at)
			 VALUES ('proxy', $1, $2, 'x', 0)`, NewID(), worker)
		if constraintOf(err) != foreignKeyViolation {
			t.Fatalf("raw registration of a team worker's ID: err = %v, want a foreign key violation", err)
		}
	})
}

func TestTokensAreStoredOnlyAsHashes(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		project := mustProject(t, db, team.ID, "web")
		_, regToken, err := db.CreateRegistration(ctx, Peer{PeerProject, project.ID}, NewID(), DefaultWorkerSettings())
		if err != nil {
			t.Fatal(err)
		}
		_, teamToken, err := db.CreateTeamWorker(ctx, team.ID, NewID(), DefaultWorkerSettings())
		if err != nil {
			t.Fatal(err)
		}
		if len(regToken) < 43 || len(teamToken) < 43 || regToken == teamToken {
			t.Fatalf("weak or repeated tokens: %d and %d characters", len(regToken), len(teamToken))
		}
		for _, table := range []string{"worker_registrations", "team_workers"} {
			for _, row := range dumpTable(t, db, table) {
				for _, token := range []string{regToken, teamToken} {
					if strings.Contains(row, token) {
						t.Fatalf("%s holds a plaintext token", table)
					}
				}
				if !strings.Contains(row, "$argon2id$") {
					t.Fatalf("%s row has no argon2id hash: %s", table, row)
				}
			}
		}
	})
}

// dumpTable returns every row of table as one string of its text values.
func dumpTable(t *testing.T, db *DB, table string) []string {
	t.Helper()
	rows, err := db.sql.QueryContext(t.Context(), `SELECT * FROM `+table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	columns, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		values := make([]sql.NullString, len(columns))
		ptrs := make([]any, len(columns))
		for i := range values {
			ptrs[i] = &values[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, v := range values {
			b.WriteString(v.String)
			b.WriteByte('|')
		}
		out = append(out, b.String())
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s is empty", table)
	}
	return out
}
