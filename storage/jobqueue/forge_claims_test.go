package jobqueue

import (
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/storage"
)

func testInstance(id string) storage.ServerInstance {
	return storage.ServerInstance{ID: id, Host: "host-" + id, Addr: "127.0.0.1:1", PID: 42, Version: "test"}
}

// Two posters claiming the outbox at once each get different rows; a
// claimed row is not due for the other until its claim ends or the
// claimant posts it.
func TestForgeStatusClaims(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		if err := db.SetForgeLink(ctx, testForgeLink(e.ProjectID)); err != nil {
			t.Fatal(err)
		}
		for range 6 {
			newEvaluationIn(t, db, e.ProjectID) // one commit "c": coalesced into one row
		}
		p2 := mustProject(t, db, mustTeam(t, db, "t2").ID, "p2")
		if err := db.SetForgeLink(ctx, testForgeLink(p2.ID)); err != nil {
			t.Fatal(err)
		}
		newEvaluationIn(t, db, p2.ID)
		for _, id := range []string{"a", "b", "c", "d"} {
			if _, err := db.RegisterInstance(ctx, testInstance(id), time.Minute, false); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now()
		var wg sync.WaitGroup
		got := map[string][]storage.ForgeStatus{}
		var mu sync.Mutex
		for _, owner := range []string{"a", "b"} {
			wg.Go(func() {
				list, err := db.ClaimDueForgeStatuses(ctx, owner, now, now.Add(time.Minute), 10)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				got[owner] = list
				mu.Unlock()
			})
		}
		wg.Wait()
		seen := map[string]string{}
		for owner, list := range got {
			for _, s := range list {
				if s.ClaimedBy != owner {
					t.Fatalf("claimed by %q returned to %s", s.ClaimedBy, owner)
				}
				key := s.ProjectID + s.Commit + s.Context
				if prev, dup := seen[key]; dup {
					t.Fatalf("row claimed by both %s and %s", prev, owner)
				}
				seen[key] = owner
			}
		}
		if len(seen) != 2 {
			t.Fatalf("claimed %d rows, want both: %+v", len(seen), got)
		}
		if again, err := db.ClaimDueForgeStatuses(ctx, "c", time.Now(), time.Now().Add(time.Minute), 10); err != nil || len(again) != 0 {
			t.Fatalf("claimed rows claimed again: %+v, %v", again, err)
		}
		if next, err := db.NextForgeStatusAt(ctx); err != nil || next.Before(now.Add(59*time.Second)) {
			t.Fatalf("next due %v (want the claims' end), %v", next, err)
		}
		// Posted by its claimant: done. Deferred: the claim ends, due later.
		var all []storage.ForgeStatus
		for _, list := range got {
			all = append(all, list...)
		}
		if done, err := db.MarkForgeStatusPosted(ctx, all[0]); err != nil || !done {
			t.Fatalf("mark posted: %v, %v", done, err)
		}
		if err := db.DeferForgeStatus(ctx, all[1], time.Now().Add(-time.Millisecond), "HTTP 502"); err != nil {
			t.Fatal(err)
		}
		again, err := db.ClaimDueForgeStatuses(ctx, "c", time.Now(), time.Now().Add(time.Minute), 10)
		if err != nil || len(again) != 1 || again[0].ProjectID != all[1].ProjectID || again[0].Attempts != 1 {
			t.Fatalf("after post and deferral: %+v, %v", again, err)
		}
		// A claim ends with its time...
		later := time.Now().Add(2 * time.Minute)
		if list, err := db.ClaimDueForgeStatuses(ctx, "d", later, later.Add(time.Minute), 10); err != nil || len(list) != 1 {
			t.Fatalf("expired claim not taken over: %+v, %v", list, err)
		}
		// ...or when its owner is no longer a live instance.
		if list, err := db.ClaimDueForgeStatuses(ctx, "c", time.Now(), time.Now().Add(time.Minute), 10); err != nil || len(list) != 0 {
			t.Fatalf("d's claim did not hold: %+v, %v", list, err)
		}
		if err := db.DeleteInstance(ctx, "d"); err != nil {
			t.Fatal(err)
		}
		if list, err := db.ClaimDueForgeStatuses(ctx, "c", time.Now(), time.Now().Add(time.Minute), 10); err != nil || len(list) != 1 {
			t.Fatalf("a gone instance's claim still holds: %+v, %v", list, err)
		}
	})
}
