package storage

import (
	"bytes"
	"errors"
	"testing"
)

func TestDialTokens(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		web := mustProject(t, db, team.ID, "web")
		peer := Peer{PeerProject, web.ID}
		dialed := DefaultWorkerSettings()
		dialed.URL = "wss://w.example/proto"
		worker, inbound, teamWorker := NewID(), NewID(), NewID()
		if _, _, err := db.CreateRegistration(ctx, peer, worker, dialed); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.CreateRegistration(ctx, peer, inbound, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.CreateTeamWorker(ctx, team.ID, teamWorker, dialed); err != nil {
			t.Fatal(err)
		}
		sealed := []byte{1, 0, 255, 7}
		for name, err := range map[string]error{
			"no URL":        db.SetRegistrationDialToken(ctx, peer, inbound, sealed),
			"empty":         db.SetRegistrationDialToken(ctx, peer, worker, nil),
			"team no bytes": db.SetTeamWorkerDialToken(ctx, teamWorker, nil),
		} {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: err = %v, want ErrInvalid", name, err)
			}
		}
		if err := db.SetRegistrationDialToken(ctx, peer, NewID(), sealed); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown registration: err = %v, want ErrNotFound", err)
		}
		if err := db.SetRegistrationDialToken(ctx, peer, worker, sealed); err != nil {
			t.Fatal(err)
		}
		if err := db.SetTeamWorkerDialToken(ctx, teamWorker, sealed); err != nil {
			t.Fatal(err)
		}
		targets, err := db.DialTargets(ctx)
		if err != nil || len(targets) != 2 {
			t.Fatalf("DialTargets = %+v, %v", targets, err)
		}
		for _, d := range targets {
			var got []byte
			if d.TeamWorker != nil {
				got = d.TeamWorker.DialTokenSealed
			} else {
				got = d.Registrations[0].DialTokenSealed
			}
			if !bytes.Equal(got, sealed) {
				t.Fatalf("target %s: sealed %v, want %v", d.WorkerID, got, sealed)
			}
		}

		// A new token invalidates the sealed copy; so does dropping the URL.
		if _, err := db.RotateRegistrationToken(ctx, peer, worker); err != nil {
			t.Fatal(err)
		}
		if r, _ := db.Registration(ctx, peer, worker); r.DialTokenSealed != nil {
			t.Fatalf("rotation kept the sealed token: %+v", r)
		}
		if err := db.SetRegistrationDialToken(ctx, peer, worker, sealed); err != nil {
			t.Fatal(err)
		}
		moved := dialed
		moved.URL = "wss://elsewhere.example/proto"
		if err := db.UpdateRegistration(ctx, peer, worker, moved); err != nil {
			t.Fatal(err)
		}
		if r, _ := db.Registration(ctx, peer, worker); !bytes.Equal(r.DialTokenSealed, sealed) {
			t.Fatalf("a new URL dropped the sealed token: %+v", r)
		}
		if err := db.UpdateRegistration(ctx, peer, worker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		if r, _ := db.Registration(ctx, peer, worker); r.DialTokenSealed != nil {
			t.Fatalf("removing the URL kept the sealed token: %+v", r)
		}
		if _, err := db.RotateTeamWorkerToken(ctx, teamWorker); err != nil {
			t.Fatal(err)
		}
		if w, _ := db.TeamWorker(ctx, teamWorker); w.DialTokenSealed != nil {
			t.Fatalf("team rotation kept the sealed token: %+v", w)
		}
		if err := db.SetTeamWorkerDialToken(ctx, teamWorker, sealed); err != nil {
			t.Fatal(err)
		}
		if err := db.UpdateTeamWorker(ctx, teamWorker, DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		if w, _ := db.TeamWorker(ctx, teamWorker); w.DialTokenSealed != nil {
			t.Fatalf("removing the team worker's URL kept the sealed token: %+v", w)
		}
	})
}
