package storage

import (
	"errors"
	"testing"
)

func TestTeams(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team, err := db.CreateTeam(ctx, "infra")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := canonicalUUID("id", team.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.CreateTeam(ctx, "infra"); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate team name: err = %v, want ErrConflict", err)
		}
		for _, bad := range []string{"", "has space", "-dash", "a/b", string(make([]byte, 65))} {
			if _, err := db.CreateTeam(ctx, bad); !errors.Is(err, ErrInvalid) {
				t.Fatalf("name %q: err = %v, want ErrInvalid", bad, err)
			}
		}
		got, err := db.Team(ctx, team.ID)
		if err != nil || got.Name != "infra" || !got.CreatedAt.Equal(team.CreatedAt) {
			t.Fatalf("Team = %+v, %v; want %+v", got, err, team)
		}
		if got, err := db.TeamByName(ctx, "infra"); err != nil || got.ID != team.ID {
			t.Fatalf("TeamByName = %+v, %v", got, err)
		}
		if _, err := db.Team(ctx, NewID()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown team: err = %v", err)
		}
		if _, err := db.Team(ctx, "not-a-uuid"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("bad ID: err = %v", err)
		}
		if _, err := db.CreateTeam(ctx, "alpha"); err != nil {
			t.Fatal(err)
		}
		teams, err := db.ListTeams(ctx)
		if err != nil || len(teams) != 2 || teams[0].Name != "alpha" || teams[1].Name != "infra" {
			t.Fatalf("ListTeams = %+v, %v", teams, err)
		}

		project := mustProject(t, db, team.ID, "web")
		if err := db.DeleteTeam(ctx, team.ID); !errors.Is(err, ErrConflict) {
			t.Fatalf("delete team with projects: err = %v, want ErrConflict", err)
		}
		if err := db.DeleteProject(ctx, project.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteTeam(ctx, team.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteTeam(ctx, team.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete deleted team: err = %v", err)
		}
	})
}

func TestDeleteTeamRemovesTeamWorkersAndGrants(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		owner := mustTeam(t, db, "owner")
		builders := mustTeam(t, db, "builders")
		project := mustProject(t, db, owner.ID, "web")
		worker := NewID()
		if _, _, err := db.CreateTeamWorker(ctx, builders.ID, worker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		if _, err := db.GrantTeam(ctx, project.ID, builders.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteTeam(ctx, builders.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.TeamWorker(ctx, worker); !errors.Is(err, ErrNotFound) {
			t.Fatalf("team worker survived its team: err = %v", err)
		}
		teams, err := db.ProjectGrantedTeams(ctx, project.ID)
		if err != nil || len(teams) != 0 {
			t.Fatalf("grants survived the team: %+v, %v", teams, err)
		}
		// The freed worker ID can be registered now.
		if _, _, err := db.CreateRegistration(ctx, Peer{PeerProject, project.ID}, worker, DefaultWorkerSettings()); err != nil {
			t.Fatalf("register a deleted team worker's ID: %v", err)
		}
	})
}

func mustTeam(t *testing.T, db *DB, name string) Team {
	t.Helper()
	team, err := db.CreateTeam(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return team
}

func mustProject(t *testing.T, db *DB, teamID, name string) Project {
	t.Helper()
	p, err := db.CreateProject(t.Context(), NewProject{
		TeamID: teamID, Name: name, Repository: "git+https://example.com/" + name, Branch: "main",
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustCache(t *testing.T, db *DB, name string) Cache {
	t.Helper()
	c, err := db.CreateCache(t.Context(), NewCache{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
