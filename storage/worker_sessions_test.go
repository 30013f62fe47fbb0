package storage

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// The claim rules of worker_sessions: one holder per worker ID; another
// instance takes a claim over only once its lease ran out; the holder's
// own instance replaces a row its release missed; renewals and releases
// touch only the session's own row.
func TestWorkerSessionClaims(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		worker := NewID()
		at := time.UnixMilli(time.Now().UnixMilli())
		a1 := WorkerSession{WorkerID: worker, InstanceID: "a", Nonce: "a1", ConnectedAt: at, Status: []byte(`{"live":true}`)}
		b1 := WorkerSession{WorkerID: worker, InstanceID: "b", Nonce: "b1", ConnectedAt: at}
		claim := func(s WorkerSession, ttl time.Duration) string {
			t.Helper()
			holder, err := db.ClaimWorkerSession(ctx, s, ttl)
			if err != nil {
				t.Fatal(err)
			}
			return holder
		}
		if h := claim(a1, time.Minute); h != "" {
			t.Fatalf("first claim refused, holder %q", h)
		}
		if h := claim(b1, time.Minute); h != "a" {
			t.Fatalf("B's claim over A's live lease: holder %q, want a", h)
		}
		got, ok, err := db.LiveWorkerSession(ctx, worker)
		if err != nil || !ok || got.InstanceID != "a" || got.Nonce != "a1" || !got.ConnectedAt.Equal(at) || string(got.Status) != `{"live":true}` {
			t.Fatalf("live session %+v %v %v", got, ok, err)
		}
		// B cannot renew or release A's claim.
		if lost, err := db.RenewWorkerSessions(ctx, "b", []WorkerSession{b1}, time.Minute); err != nil || !slices.Equal(lost, []string{worker}) {
			t.Fatalf("B renewing a claim it does not hold: lost %v, %v", lost, err)
		}
		if err := db.ReleaseWorkerSession(ctx, worker, "b", "a1"); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := db.LiveWorkerSession(ctx, worker); !ok {
			t.Fatal("B released A's claim")
		}
		// A's own instance replaces a row of its own (its release missed).
		a2 := a1
		a2.Nonce = "a2"
		if h := claim(a2, time.Minute); h != "" {
			t.Fatalf("A's new session refused by A's stale row: %q", h)
		}
		if lost, err := db.RenewWorkerSessions(ctx, "a", []WorkerSession{a1, a2}, time.Minute); err != nil || !slices.Equal(lost, []string{worker}) {
			t.Fatalf("renewing the replaced and the current session: lost %v, %v (want the old nonce lost)", lost, err)
		}

		// A lease that ran out is taken over; the old holder's renewal
		// then finds its claim lost, and its release leaves the new one.
		if lost, err := db.RenewWorkerSessions(ctx, "a", []WorkerSession{a2}, -time.Second); err != nil || len(lost) != 0 {
			t.Fatalf("renew: %v %v", lost, err)
		}
		if _, ok, _ := db.LiveWorkerSession(ctx, worker); ok {
			t.Fatal("an expired claim is listed live")
		}
		if h := claim(b1, time.Minute); h != "" {
			t.Fatalf("B's claim over an expired lease refused: %q", h)
		}
		if lost, err := db.RenewWorkerSessions(ctx, "a", []WorkerSession{a2}, time.Minute); err != nil || !slices.Equal(lost, []string{worker}) {
			t.Fatalf("A renewing after the takeover: lost %v, %v", lost, err)
		}
		if err := db.ReleaseWorkerSession(ctx, worker, "a", "a2"); err != nil {
			t.Fatal(err)
		}
		all, err := db.LiveWorkerSessions(ctx)
		if err != nil || len(all) != 1 || all[0].InstanceID != "b" {
			t.Fatalf("every live session: %+v %v", all, err)
		}
		// Another worker on A, one whose claim expired on A: the counts
		// per instance are of live claims only.
		other := WorkerSession{WorkerID: NewID(), InstanceID: "a", Nonce: "o1", ConnectedAt: at}
		gone := WorkerSession{WorkerID: NewID(), InstanceID: "a", Nonce: "g1", ConnectedAt: at}
		claim(other, time.Minute)
		claim(gone, -time.Second)
		if counts, err := db.LiveWorkerSessionCounts(ctx); err != nil || len(counts) != 2 || counts["a"] != 1 || counts["b"] != 1 {
			t.Fatalf("sessions per instance: %v %v (want a:1 b:1)", counts, err)
		}
		if err := db.ReleaseWorkerSession(ctx, other.WorkerID, "a", "o1"); err != nil {
			t.Fatal(err)
		}
		if err := db.ReleaseWorkerSession(ctx, worker, "b", "b1"); err != nil {
			t.Fatal(err)
		}
		if all, err := db.LiveWorkerSessions(ctx); err != nil || len(all) != 0 {
			t.Fatalf("after the release: %+v %v", all, err)
		}
	})
}

// Instances claiming one worker ID at once: exactly one wins.
func TestWorkerSessionClaimRace(t *testing.T) {
	t.Parallel()
	db := openTestDB(t, freshPostgresURL(t))
	for range 20 {
		worker := NewID()
		var wg sync.WaitGroup
		var mu sync.Mutex
		winners := 0
		for i := range 8 {
			wg.Go(func() {
				s := WorkerSession{WorkerID: worker, InstanceID: string(rune('a' + i)), Nonce: NewID(), ConnectedAt: time.Now()}
				holder, err := db.ClaimWorkerSession(t.Context(), s, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if holder == "" {
					mu.Lock()
					winners++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if winners != 1 {
			t.Fatalf("%d instances claimed worker %s at once", winners, worker)
		}
	}
}

// Notes between instances: a listener gets what another pool on its
// schema sends, not what one in another schema does; SQLite has none.
func TestWorkerSessionNotes(t *testing.T) {
	t.Parallel()
	url := freshPostgresURL(t)
	listener, sender := openTestDB(t, url), openTestDB(t, url)
	got := make(chan string, 1)
	ready := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		done <- listener.ListenWorkerSessions(ctx, func() { close(ready) }, func(p string) { got <- p })
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("never listening")
	}
	// A deployment in another schema of the same database is not heard.
	other := openTestDB(t, freshPostgresURL(t))
	if err := other.NotifyWorkerSessions(t.Context(), `{"to":"other schema"}`); err != nil {
		t.Fatal(err)
	}
	if err := sender.NotifyWorkerSessions(t.Context(), `{"to":"a"}`); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p != `{"to":"a"}` {
			t.Fatalf("payload %q", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification")
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("listening ended without an error")
	}
	// The pool is still usable after the listening connection was dropped.
	if err := listener.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}

	lite := openTestDB(t, freshSQLiteURL(t))
	if err := lite.NotifyWorkerSessions(t.Context(), "x"); !errors.Is(err, sqldb.ErrNoNotifications) {
		t.Fatalf("SQLite notify: %v", err)
	}
}
