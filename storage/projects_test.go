package storage

import (
	"errors"
	"testing"
)

func TestProjects(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		a := mustTeam(t, db, "a")
		b := mustTeam(t, db, "b")
		web := mustProject(t, db, a.ID, "web")
		if _, err := db.CreateProject(ctx, NewProject{TeamID: a.ID, Name: "web", Repository: "r", Branch: "main"}); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate name in team: err = %v, want ErrConflict", err)
		}
		mustProject(t, db, b.ID, "web") // the same name in another team is fine
		if _, err := db.CreateProject(ctx, NewProject{TeamID: NewID(), Name: "x", Repository: "r", Branch: "main"}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown team: err = %v, want ErrNotFound", err)
		}
		if _, err := db.CreateProject(ctx, NewProject{TeamID: a.ID, Name: "x", Repository: " ", Branch: "main"}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("empty repository: err = %v, want ErrInvalid", err)
		}

		got, err := db.Project(ctx, web.ID)
		if err != nil || got != web {
			t.Fatalf("Project = %+v, %v; want %+v", got, err, web)
		}
		if got, err := db.ProjectByName(ctx, a.ID, "web"); err != nil || got.ID != web.ID {
			t.Fatalf("ProjectByName = %+v, %v", got, err)
		}
		if err := db.UpdateProjectSource(ctx, web.ID, "git+https://example.com/new", "release"); err != nil {
			t.Fatal(err)
		}
		if got, _ := db.Project(ctx, web.ID); got.Repository != "git+https://example.com/new" || got.Branch != "release" {
			t.Fatalf("after update: %+v", got)
		}
		if err := db.UpdateProjectSource(ctx, NewID(), "r", "b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("update unknown: err = %v", err)
		}
		all, err := db.ListProjects(ctx)
		if err != nil || len(all) != 2 {
			t.Fatalf("ListProjects = %+v, %v", all, err)
		}
		own, err := db.ListTeamProjects(ctx, a.ID)
		if err != nil || len(own) != 1 || own[0].ID != web.ID {
			t.Fatalf("ListTeamProjects = %+v, %v", own, err)
		}
	})
}

func TestDeleteProjectRemovesItsLinks(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		project := mustProject(t, db, team.ID, "web")
		cache := mustCache(t, db, "main")
		worker := NewID()
		if _, err := db.SubscribeProject(ctx, project.ID, cache.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.GrantTeam(ctx, project.ID, team.ID); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.CreateRegistration(ctx, Peer{PeerProject, project.ID}, worker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteProject(ctx, project.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteProject(ctx, project.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete twice: err = %v", err)
		}
		regs, err := db.RegistrationsOfWorker(ctx, worker)
		if err != nil || len(regs) != 0 {
			t.Fatalf("registrations survived the project: %+v, %v", regs, err)
		}
		projects, err := db.CacheProjects(ctx, cache.ID)
		if err != nil || len(projects) != 0 {
			t.Fatalf("subscriptions survived the project: %+v, %v", projects, err)
		}
		granting, err := db.TeamGrantingProjects(ctx, team.ID)
		if err != nil || len(granting) != 0 {
			t.Fatalf("grants survived the project: %+v, %v", granting, err)
		}
		// The worker ID is free for a team worker again.
		if _, _, err := db.CreateTeamWorker(ctx, team.ID, worker, DefaultWorkerSettings()); err != nil {
			t.Fatalf("team worker with a freed ID: %v", err)
		}
	})
}
