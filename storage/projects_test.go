package storage

import (
	"errors"
	"reflect"
	"slices"
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
		if err != nil || !reflect.DeepEqual(got, web) {
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

func TestProjectWildcards(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		plain := mustProject(t, db, team.ID, "plain")
		if got, _ := db.Project(ctx, plain.ID); !slices.Equal(got.Wildcards, DefaultWildcards()) {
			t.Fatalf("project created without wildcards has %q, want the default", got.Wildcards)
		}
		own := []string{"packages.*.*", "checks.x86_64-linux.*", "!checks.x86_64-linux.slow"}
		checked, err := db.CreateProject(ctx, NewProject{TeamID: team.ID, Name: "checked", Repository: "r", Branch: "main", Wildcards: own})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := db.ProjectByName(ctx, team.ID, "checked"); !slices.Equal(got.Wildcards, own) {
			t.Fatalf("read back %q, want %q", got.Wildcards, own)
		}
		for _, bad := range [][]string{{""}, {"packages.*.*", "  "}} {
			if _, err := db.CreateProject(ctx, NewProject{TeamID: team.ID, Name: "bad", Repository: "r", Branch: "main", Wildcards: bad}); !errors.Is(err, ErrInvalid) {
				t.Fatalf("create with %q: err = %v, want ErrInvalid", bad, err)
			}
		}

		if err := db.UpdateProjectWildcards(ctx, checked.ID, []string{"hydraJobs.*"}); err != nil {
			t.Fatal(err)
		}
		if updated, err := db.Project(ctx, checked.ID); err != nil || !slices.Equal(updated.Wildcards, []string{"hydraJobs.*"}) {
			t.Fatalf("after update: %q, %v", updated.Wildcards, err)
		}
		for _, bad := range [][]string{nil, {}, {" "}} {
			if err := db.UpdateProjectWildcards(ctx, checked.ID, bad); !errors.Is(err, ErrInvalid) {
				t.Fatalf("update to %q: err = %v, want ErrInvalid", bad, err)
			}
		}
		if err := db.UpdateProjectWildcards(ctx, NewID(), own); !errors.Is(err, ErrNotFound) {
			t.Fatalf("update unknown: err = %v", err)
		}
		cache := mustCache(t, db, "main")
		if _, err := db.SubscribeProject(ctx, checked.ID, cache.ID); err != nil {
			t.Fatal(err)
		}
		if subscribed, err := db.CacheProjects(ctx, cache.ID); err != nil || len(subscribed) != 1 || !slices.Equal(subscribed[0].Wildcards, []string{"hydraJobs.*"}) {
			t.Fatalf("CacheProjects = %+v, %v", subscribed, err)
		}
		list, err := db.ListTeamProjects(ctx, team.ID)
		if err != nil || len(list) != 2 || !slices.Equal(list[0].Wildcards, []string{"hydraJobs.*"}) || !slices.Equal(list[1].Wildcards, DefaultWildcards()) {
			t.Fatalf("ListTeamProjects = %+v, %v", list, err)
		}
	})
}

// TestProjectWildcardsMigration: projects that exist when migration 0012
// runs get the default wildcards, the pattern every evaluation used before.
func TestProjectWildcardsMigration(t *testing.T) {
	t.Parallel()
	forEachEngineURL(t, func(t *testing.T, engine Engine, dbURL string) {
		ctx := t.Context()
		db := openTestDB(t, dbURL)
		team := mustTeam(t, db, "a")
		// Back to the schema before 0012, with a project in it.
		for _, stmt := range []string{
			`ALTER TABLE projects DROP COLUMN wildcards`,
			`DELETE FROM schema_migrations WHERE version = 12`,
		} {
			if _, err := db.sql.ExecContext(ctx, stmt); err != nil {
				t.Fatal(err)
			}
		}
		id := NewID()
		if _, err := db.sql.ExecContext(ctx,
			`INSERT INTO projects (id, team_id, name, repository, branch, created_at) VALUES ($1, $2, 'old', 'r', 'main', 0)`,
			id, team.ID); err != nil {
			t.Fatal(err)
		}
		db.Close()

		again := openTestDB(t, dbURL)
		p, err := again.Project(ctx, id)
		if err != nil || !slices.Equal(p.Wildcards, DefaultWildcards()) {
			t.Fatalf("existing project after the migration: %q, %v; want %q", p.Wildcards, err, DefaultWildcards())
		}
	})
}
