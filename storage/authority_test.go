package storage

import (
	"errors"
	"testing"
)

func TestWorkerAccess(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		owner := mustTeam(t, db, "owner")
		builders := mustTeam(t, db, "builders")
		web := mustProject(t, db, owner.ID, "web")
		api := mustProject(t, db, owner.ID, "api")
		mustProject(t, db, owner.ID, "docs") // grants nothing

		unknown, err := db.WorkerAccess(ctx, NewID())
		if err != nil || unknown.Known() {
			t.Fatalf("unknown worker: %+v, %v", unknown, err)
		}
		if _, err := db.WorkerAccess(ctx, "nope"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("bad worker ID: err = %v", err)
		}

		registered := NewID()
		for _, p := range []Project{web, api} {
			if _, _, err := db.CreateRegistration(ctx, Peer{PeerProject, p.ID}, registered, DefaultWorkerSettings()); err != nil {
				t.Fatal(err)
			}
		}
		access, err := db.WorkerAccess(ctx, registered)
		if err != nil || !access.Known() || len(access.Registrations) != 2 || access.TeamWorker != nil || access.Deactivated {
			t.Fatalf("registered worker: %+v, %v", access, err)
		}

		teamWorker := NewID()
		if _, _, err := db.CreateTeamWorker(ctx, builders.ID, teamWorker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		access, err = db.WorkerAccess(ctx, teamWorker)
		if err != nil || access.TeamWorker == nil || len(access.GrantingProjects) != 0 {
			t.Fatalf("team worker without grants: %+v, %v", access, err)
		}
		for _, p := range []Project{web, api} {
			if added, err := db.GrantTeam(ctx, p.ID, builders.ID); err != nil || !added {
				t.Fatalf("grant: added=%v err=%v", added, err)
			}
		}
		if added, err := db.GrantTeam(ctx, web.ID, builders.ID); err != nil || added {
			t.Fatalf("grant again: added=%v err=%v", added, err)
		}
		if _, err := db.GrantTeam(ctx, web.ID, NewID()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("grant to unknown team: err = %v", err)
		}
		access, err = db.WorkerAccess(ctx, teamWorker)
		if err != nil || access.TeamWorker.TeamID != builders.ID || len(access.GrantingProjects) != 2 ||
			access.GrantingProjects[0].Name != "api" || access.GrantingProjects[1].Name != "web" {
			t.Fatalf("team worker with grants: %+v, %v", access, err)
		}
		if err := db.RevokeTeam(ctx, api.ID, builders.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.RevokeTeam(ctx, api.ID, builders.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoke twice: err = %v", err)
		}
		teams, err := db.ProjectGrantedTeams(ctx, web.ID)
		if err != nil || len(teams) != 1 || teams[0].ID != builders.ID {
			t.Fatalf("ProjectGrantedTeams = %+v, %v", teams, err)
		}

		if err := db.DeactivateWorker(ctx, teamWorker); err != nil {
			t.Fatal(err)
		}
		access, err = db.WorkerAccess(ctx, teamWorker)
		if err != nil || !access.Deactivated {
			t.Fatalf("deactivated team worker: %+v, %v", access, err)
		}
	})
}

func TestDeactivation(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		project := mustProject(t, db, team.ID, "web")
		worker := NewID()
		if err := db.DeactivateWorker(ctx, worker); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deactivate unknown worker: err = %v", err)
		}
		if _, _, err := db.CreateRegistration(ctx, Peer{PeerProject, project.ID}, worker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		assertDeactivated(t, db, worker, false)
		for range 2 { // idempotent
			if err := db.DeactivateWorker(ctx, worker); err != nil {
				t.Fatal(err)
			}
		}
		assertDeactivated(t, db, worker, true)
		for range 2 {
			if err := db.ActivateWorker(ctx, worker); err != nil {
				t.Fatal(err)
			}
		}
		assertDeactivated(t, db, worker, false)
		if err := db.ActivateWorker(ctx, NewID()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("activate unknown worker: err = %v", err)
		}
	})
}

func assertDeactivated(t *testing.T, db *DB, workerID string, want bool) {
	t.Helper()
	got, err := db.WorkerDeactivated(t.Context(), workerID)
	if err != nil || got != want {
		t.Fatalf("WorkerDeactivated = %v, %v; want %v", got, err, want)
	}
}

func TestDialTargets(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		web := mustProject(t, db, team.ID, "web")
		api := mustProject(t, db, team.ID, "api")
		cache := mustCache(t, db, "main")
		at := func(url string) WorkerSettings {
			s := DefaultWorkerSettings()
			s.URL = url
			return s
		}
		dialed, split, inbound, teamDialed, off := NewID(), NewID(), NewID(), NewID(), NewID()
		mustRegister := func(p Peer, worker string, s WorkerSettings) {
			t.Helper()
			if _, _, err := db.CreateRegistration(ctx, p, worker, s); err != nil {
				t.Fatal(err)
			}
		}
		mustRegister(Peer{PeerProject, web.ID}, dialed, at("wss://a.example/proto"))
		mustRegister(Peer{PeerCache, cache.ID}, dialed, at("wss://a.example/proto"))
		mustRegister(Peer{PeerProject, web.ID}, split, at("wss://b1.example/proto"))
		mustRegister(Peer{PeerProject, api.ID}, split, at("wss://b2.example/proto"))
		mustRegister(Peer{PeerProject, web.ID}, inbound, DefaultWorkerSettings())
		mustRegister(Peer{PeerProject, web.ID}, off, at("wss://off.example/proto"))
		if _, _, err := db.CreateTeamWorker(ctx, team.ID, teamDialed, at("wss://team.example/proto")); err != nil {
			t.Fatal(err)
		}
		if err := db.DeactivateWorker(ctx, off); err != nil {
			t.Fatal(err)
		}

		targets, err := db.DialTargets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]DialTarget{}
		for _, d := range targets {
			got[d.WorkerID+" "+d.URL] = d
		}
		if len(targets) != 4 || len(got) != 4 {
			t.Fatalf("DialTargets = %+v, want 4 distinct targets", targets)
		}
		if d := got[dialed+" wss://a.example/proto"]; len(d.Registrations) != 2 || d.TeamWorker != nil {
			t.Fatalf("two peers at one URL: %+v", d)
		}
		if d := got[split+" wss://b1.example/proto"]; len(d.Registrations) != 1 {
			t.Fatalf("split worker, first URL: %+v", d)
		}
		if d := got[split+" wss://b2.example/proto"]; len(d.Registrations) != 1 {
			t.Fatalf("split worker, second URL: %+v", d)
		}
		if d := got[teamDialed+" wss://team.example/proto"]; d.TeamWorker == nil || d.TeamWorker.TeamID != team.ID {
			t.Fatalf("team worker target: %+v", d)
		}
	})
}

func TestProjectWorkers(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		owner := mustTeam(t, db, "owner")
		builders := mustTeam(t, db, "builders")
		web := mustProject(t, db, owner.ID, "web")
		registered, teamWorker, ungranted := NewID(), NewID(), NewID()
		dialed := WorkerSettings{URL: "wss://w.example/proto", EnableEval: true}
		if _, _, err := db.CreateRegistration(ctx, Peer{PeerProject, web.ID}, registered, dialed); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.CreateTeamWorker(ctx, builders.ID, teamWorker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.CreateTeamWorker(ctx, owner.ID, ungranted, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		if _, err := db.GrantTeam(ctx, web.ID, builders.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.DeactivateWorker(ctx, teamWorker); err != nil {
			t.Fatal(err)
		}
		workers, err := db.ProjectWorkers(ctx, web.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := []ProjectWorker{
			{WorkerID: registered, WorkerSettings: dialed},
			{WorkerID: teamWorker, TeamID: builders.ID, WorkerSettings: DefaultWorkerSettings(), Deactivated: true},
		}
		if len(workers) != len(want) || workers[0] != want[0] || workers[1] != want[1] {
			t.Fatalf("ProjectWorkers = %+v\nwant %+v", workers, want)
		}
		if _, err := db.ProjectWorkers(ctx, NewID()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown project: err = %v", err)
		}
	})
}
