package storage

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func testForgeLink(projectID string) ForgeLink {
	return ForgeLink{
		ProjectID: projectID, Kind: "github", APIURL: "https://api.github.com", Repository: "o/r",
		CredentialSealed: []byte{1, 2, 3}, Trust: ForgeTrustApprove, StatusContext: "gradient/p",
	}
}

func TestForgeLinks(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		p := mustProject(t, db, mustTeam(t, db, "t").ID, "p")
		if _, err := db.ForgeLink(ctx, p.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("link of a project without one: %v", err)
		}
		if err := db.SetForgeWebhookSecret(ctx, p.ID, []byte{9}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("secret without a link: %v", err)
		}
		bad := testForgeLink(p.ID)
		bad.Trust = "some"
		if err := db.SetForgeLink(ctx, bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("unknown trust: %v", err)
		}
		if err := db.SetForgeLink(ctx, testForgeLink(NewID())); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown project: %v", err)
		}
		if err := db.SetForgeLink(ctx, testForgeLink(p.ID)); err != nil {
			t.Fatal(err)
		}
		if err := db.SetForgeWebhookSecret(ctx, p.ID, []byte{0, 7, 255}); err != nil {
			t.Fatal(err)
		}
		// Setting the link again (new credential, an App) keeps the secret.
		again := testForgeLink(p.ID)
		again.AppID, again.CredentialSealed, again.Trust, again.PerBuildStatuses = 42, []byte{4}, ForgeTrustAll, true
		if err := db.SetForgeLink(ctx, again); err != nil {
			t.Fatal(err)
		}
		l, err := db.ForgeLink(ctx, p.ID)
		if err != nil || l.AppID != 42 || !bytes.Equal(l.CredentialSealed, []byte{4}) || l.Trust != ForgeTrustAll ||
			!l.PerBuildStatuses || !bytes.Equal(l.WebhookSecretSealed, []byte{0, 7, 255}) || l.StatusContext != "gradient/p" {
			t.Fatalf("link %+v, %v", l, err)
		}
		if err := db.DeleteForgeLink(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteForgeLink(ctx, p.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleting twice: %v", err)
		}
	})
}

func TestForgeDeliveriesDedupe(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		p := mustProject(t, db, mustTeam(t, db, "t").ID, "p")
		for i, want := range []bool{true, false} {
			fresh, err := db.RecordForgeDelivery(ctx, p.ID, "d-1")
			if err != nil || fresh != want {
				t.Fatalf("delivery %d: fresh %v, %v; want %v", i, fresh, err, want)
			}
		}
		if err := db.ForgetForgeDelivery(ctx, p.ID, "d-1"); err != nil {
			t.Fatal(err)
		}
		if fresh, err := db.RecordForgeDelivery(ctx, p.ID, "d-1"); err != nil || !fresh {
			t.Fatalf("a forgotten delivery is new again: %v, %v", fresh, err)
		}
		if _, err := db.RecordForgeDelivery(ctx, p.ID, string(make([]byte, MaxDeliveryIDLength+1))); !errors.Is(err, ErrInvalid) {
			t.Fatalf("oversized delivery ID: %v", err)
		}
		if n, err := db.PruneForgeDeliveries(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Fatalf("pruning recent deliveries: %d, %v", n, err)
		}
		if n, err := db.PruneForgeDeliveries(ctx, time.Now().Add(time.Hour)); err != nil || n != 1 {
			t.Fatalf("pruning old deliveries: %d, %v", n, err)
		}
		if fresh, err := db.RecordForgeDelivery(ctx, p.ID, "d-1"); err != nil || !fresh {
			t.Fatalf("a pruned delivery is new again: %v, %v", fresh, err)
		}
	})
}
