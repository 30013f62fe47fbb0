package storage

import (
	"bytes"
	"errors"
	"testing"
)

func TestDeployKeys(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "t")
		p := mustProject(t, db, team.ID, "p")
		if _, err := db.DeployKey(ctx, p.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deploy key of a project without one: %v, want ErrNotFound", err)
		}
		if err := db.SetDeployKey(ctx, NewID(), "ssh-ed25519 AAAA", []byte{1}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deploy key of an unknown project: %v, want ErrNotFound", err)
		}
		if err := db.SetDeployKey(ctx, p.ID, "not a key", []byte{1}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("a malformed public key: %v, want ErrInvalid", err)
		}
		if err := db.SetDeployKey(ctx, p.ID, "ssh-ed25519 AAAA first", []byte{1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		// Generating again replaces the key (rotation).
		if err := db.SetDeployKey(ctx, p.ID, "ssh-ed25519 BBBB second", []byte{0, 4, 5, 255}); err != nil {
			t.Fatal(err)
		}
		k, err := db.DeployKey(ctx, p.ID)
		if err != nil || k.PublicKey != "ssh-ed25519 BBBB second" || !bytes.Equal(k.PrivateSealed, []byte{0, 4, 5, 255}) || k.CreatedAt.IsZero() {
			t.Fatalf("deploy key %+v, %v", k, err)
		}
		if err := db.DeleteDeployKey(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteDeployKey(ctx, p.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleting twice: %v, want ErrNotFound", err)
		}
		// A deleted project takes its key along.
		if err := db.SetDeployKey(ctx, p.ID, "ssh-ed25519 CCCC", []byte{1}); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteProject(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.DeployKey(ctx, p.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deploy key of a deleted project: %v", err)
		}
	})
}
