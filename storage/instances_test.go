package storage

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// One lease holder at a time, whoever asks; it expires unless renewed,
// and another owner takes it only then.
func TestLeases(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		if ok, err := db.AcquireLease(ctx, "poll:p", "a", time.Minute); err != nil || !ok {
			t.Fatalf("first acquire: %v, %v", ok, err)
		}
		for _, owner := range []string{"a", "b"} {
			if ok, err := db.AcquireLease(ctx, "poll:p", owner, time.Minute); err != nil || ok {
				t.Fatalf("%s took a held lease: %v, %v", owner, ok, err)
			}
		}
		if l, err := db.LeaseHolder(ctx, "poll:p"); err != nil || l.Owner != "a" || !l.ExpiresAt.After(l.AcquiredAt) {
			t.Fatalf("holder %+v, %v", l, err)
		}
		if ok, err := db.RenewLease(ctx, "poll:p", "b", time.Minute); err != nil || ok {
			t.Fatalf("b renewed a's lease: %v, %v", ok, err)
		}
		if err := db.ReleaseLease(ctx, "poll:p", "b"); err != nil {
			t.Fatal(err)
		}
		if l, err := db.LeaseHolder(ctx, "poll:p"); err != nil || l.Owner != "a" {
			t.Fatalf("b released a's lease: %+v, %v", l, err)
		}
		// A short lease, not renewed, expires; then b gets it.
		if ok, err := db.AcquireLease(ctx, "gc", "a", 50*time.Millisecond); err != nil || !ok {
			t.Fatalf("gc lease: %v, %v", ok, err)
		}
		if ok, _ := db.RenewLease(ctx, "gc", "a", 50*time.Millisecond); !ok {
			t.Fatal("a could not renew its own lease")
		}
		time.Sleep(120 * time.Millisecond)
		if _, err := db.LeaseHolder(ctx, "gc"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("expired lease still held: %v", err)
		}
		if ok, err := db.AcquireLease(ctx, "gc", "b", time.Minute); err != nil || !ok {
			t.Fatalf("b could not take the expired lease: %v, %v", ok, err)
		}
		if ok, _ := db.RenewLease(ctx, "gc", "a", time.Minute); ok {
			t.Fatal("a renewed a lease b took over")
		}
		if err := db.ReleaseLease(ctx, "gc", "b"); err != nil {
			t.Fatal(err)
		}
		if ok, err := db.AcquireLease(ctx, "gc", "a", time.Minute); err != nil || !ok {
			t.Fatalf("released lease not free: %v, %v", ok, err)
		}
		if _, err := db.AcquireLease(ctx, "", "a", time.Minute); !errors.Is(err, ErrInvalid) {
			t.Fatalf("empty name: %v", err)
		}
		// Pruning drops leases long expired, never a held one.
		if ok, _ := db.AcquireLease(ctx, "old", "a", time.Millisecond); !ok {
			t.Fatal("old lease not taken")
		}
		time.Sleep(50 * time.Millisecond)
		if n, err := db.PruneLeases(ctx, 20*time.Millisecond); err != nil || n != 1 {
			t.Fatalf("pruned %d, %v; want the one expired lease", n, err)
		}
		if l, err := db.LeaseHolder(ctx, "gc"); err != nil || l.Owner != "a" {
			t.Fatalf("pruning touched a held lease: %+v, %v", l, err)
		}
	})
}

// Many owners racing for one free lease: exactly one gets it.
func TestLeaseRace(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		for round := range 5 {
			name := "race" + string(rune('a'+round))
			var wg sync.WaitGroup
			var mu sync.Mutex
			var winners []string
			for i := range 8 {
				wg.Go(func() {
					owner := string(rune('A' + i))
					ok, err := db.AcquireLease(t.Context(), name, owner, time.Minute)
					if err != nil {
						t.Error(err)
					}
					if ok {
						mu.Lock()
						winners = append(winners, owner)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(winners) != 1 {
				t.Fatalf("round %d: winners %v, want exactly one", round, winners)
			}
		}
	})
}

func testInstance(id string, fp ConfigFingerprint) ServerInstance {
	return ServerInstance{ID: id, Host: "host-" + id, Addr: "127.0.0.1:1", PID: 42, Version: "test", Fingerprint: fp}
}

// Instances register with a lease, renew it, are live until it passes and
// expired after; a clean stop deletes the row.
func TestServerInstances(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		fp := ConfigFingerprint{"dial key": "h1", "NAR store": "h2"}
		a, err := db.RegisterInstance(ctx, testInstance("a", fp), time.Minute, false)
		if err != nil {
			t.Fatal(err)
		}
		if a.Host != "host-a" || a.Fingerprint["dial key"] != "h1" || !a.LeaseUntil.After(a.StartedAt) {
			t.Fatalf("registered %+v", a)
		}
		var inUse *InstanceInUseError
		if _, err := db.RegisterInstance(ctx, testInstance("a", fp), time.Minute, false); !errors.Is(err, ErrConflict) ||
			!errors.As(err, &inUse) || inUse.Holder.Host != "host-a" || inUse.Holder.PID != 42 {
			t.Fatalf("second live instance with one ID: %v", err)
		}
		if _, err := db.RegisterInstance(ctx, testInstance("b", fp), 100*time.Millisecond, false); err != nil {
			t.Fatal(err)
		}
		live, err := db.LiveInstances(ctx)
		if err != nil || len(live) != 2 {
			t.Fatalf("live %+v, %v", live, err)
		}
		time.Sleep(200 * time.Millisecond)
		renewed, err := db.RenewInstance(ctx, "a", time.Minute)
		if err != nil || !renewed.RenewedAt.After(a.RenewedAt) {
			t.Fatalf("renew: %+v, %v", renewed, err)
		}
		live, _ = db.LiveInstances(ctx)
		expired, err := db.ExpiredInstances(ctx)
		if err != nil || len(live) != 1 || live[0].ID != "a" || len(expired) != 1 || expired[0].ID != "b" {
			t.Fatalf("after b's lease passed: live %+v, expired %+v, %v", live, expired, err)
		}
		// b restarts under its ID after the crash: its row is replaced.
		if _, err := db.RegisterInstance(ctx, testInstance("b", fp), time.Minute, false); err != nil {
			t.Fatalf("restart of an expired ID: %v", err)
		}
		if err := db.DeleteInstance(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.RenewInstance(ctx, "b", time.Minute); !errors.Is(err, ErrNotFound) {
			t.Fatalf("renewing a deleted instance: %v", err)
		}
		if live, _ := db.LiveInstances(ctx); len(live) != 1 {
			t.Fatalf("live after b stopped: %+v", live)
		}
	})
}

// An instance whose shared settings differ from a live instance's is
// refused, naming the settings; on PostgreSQL the cluster's stored
// fingerprint is checked even when no instance runs.
func TestInstanceConfigMismatch(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		fp := ConfigFingerprint{"dial key": "h1", "NAR store": "h2"}
		if _, err := db.RegisterInstance(ctx, testInstance("a", fp), time.Minute, false); err != nil {
			t.Fatal(err)
		}
		other := ConfigFingerprint{"dial key": "h1", "NAR store": "other"}
		_, err := db.RegisterInstance(ctx, testInstance("b", other), time.Minute, false)
		if db.Engine() == EngineSQLite {
			// One process: a live row is one that crashed; nothing to agree with.
			if err != nil {
				t.Fatalf("SQLite refused a changed configuration: %v", err)
			}
			return
		}
		var mismatch *ConfigMismatchError
		if !errors.As(err, &mismatch) || !slices.Equal(mismatch.Settings, []string{"NAR store"}) || mismatch.Instance != "a" {
			t.Fatalf("mismatch with a live instance: %v", err)
		}
		if _, err := db.RegisterInstance(ctx, testInstance("b", other), time.Minute, true); !errors.As(err, &mismatch) {
			t.Fatalf("--accept-config-change let in a mismatch with a live instance: %v", err)
		}
		if live, _ := db.LiveInstances(ctx); len(live) != 1 {
			t.Fatalf("refused instance registered: %+v", live)
		}
		if err := db.DeleteInstance(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		_, err = db.RegisterInstance(ctx, testInstance("b", other), time.Minute, false)
		if !errors.As(err, &mismatch) || mismatch.Instance != "" || !slices.Equal(mismatch.Settings, []string{"NAR store"}) {
			t.Fatalf("mismatch with the stored fingerprint: %v", err)
		}
		if _, err := db.RegisterInstance(ctx, testInstance("b", other), time.Minute, true); err != nil {
			t.Fatalf("accepted change: %v", err)
		}
		if _, err := db.RegisterInstance(ctx, testInstance("c", other), time.Minute, false); err != nil {
			t.Fatalf("the accepted fingerprint is the cluster's now: %v", err)
		}
	})
}
