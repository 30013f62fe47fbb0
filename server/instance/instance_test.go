package instance_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }

func join(t *testing.T, url, id string) (*storage.DB, *instance.Instance) {
	t.Helper()
	db, err := storage.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	inst, err := instance.Join(t.Context(), instance.Config{DB: db, ID: id, Host: "h", RenewEvery: 50 * time.Millisecond, Lease: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Leave(context.Background()) })
	return db, inst
}

// An instance renews its row while it runs and removes it on Leave.
func TestInstanceRenewsAndLeaves(t *testing.T) {
	t.Parallel()
	db, inst := join(t, storagetest.PostgresURL(t), "i-1")
	first := inst.Row()
	time.Sleep(1200 * time.Millisecond) // more than two leases
	live, err := db.LiveInstances(t.Context())
	if err != nil || len(live) != 1 || live[0].ID != "i-1" || !live[0].RenewedAt.After(first.RenewedAt) {
		t.Fatalf("live after two lease periods: %+v, %v (registered %+v)", live, err, first)
	}
	if err := inst.Leave(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Instance(t.Context(), "i-1"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("row after Leave: %v", err)
	}
}

// RunExclusive: one instance at a time, the holder named to the other;
// the holder's work is stopped when its lease is taken from it.
func TestRunExclusive(t *testing.T) {
	t.Parallel()
	url := storagetest.PostgresURL(t)
	dbA, a := join(t, url, "a")
	_, b := join(t, url, "b")
	running := make(chan struct{})
	stopped := make(chan error, 1)
	go func() {
		stopped <- a.RunExclusive(t.Context(), "job", func(ctx context.Context) error {
			close(running)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	<-running
	time.Sleep(700 * time.Millisecond) // past one lease: a renews it
	err := b.RunExclusive(t.Context(), "job", func(context.Context) error { t.Error("b ran while a held the lease"); return nil })
	var held *instance.ErrHeldElsewhere
	if !errors.As(err, &held) || held.Holder != "a" || !errors.Is(err, storage.ErrConflict) {
		t.Fatalf("b while a runs: %v", err)
	}
	// The lease is taken from a (as if it had expired and b took it).
	if err := dbA.ReleaseLease(t.Context(), "job", "a"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TakeFor(t.Context(), "job", time.Minute); err != nil || !ok {
		t.Fatalf("b taking the free lease: %v, %v", ok, err)
	}
	select {
	case err := <-stopped:
		if err == nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("a's work ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a's work went on after its lease was taken")
	}
}

// On SQLite the process is the only instance: every lease is its own.
func TestSQLiteLeasesAreTrivial(t *testing.T) {
	t.Parallel()
	_, a := join(t, storagetest.SQLiteURL(t), "only")
	for range 2 {
		if ok, err := a.TakeFor(t.Context(), "poll:x", time.Hour); err != nil || !ok {
			t.Fatalf("TakeFor on SQLite: %v, %v", ok, err)
		}
	}
	ran := false
	if err := a.RunExclusive(t.Context(), "gc", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("RunExclusive on SQLite: %v, ran %v", err, ran)
	}
}

// A restart under the same ID on the same host, before the crashed run's
// lease passed, takes the row over; a process that still runs keeps it.
func TestRestartReplacesCrashedPredecessor(t *testing.T) {
	t.Parallel()
	url := storagetest.PostgresURL(t)
	db, err := storage.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// A finished process's ID: this host's, and nothing runs under it.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if _, err := db.RegisterInstance(t.Context(), storage.ServerInstance{ID: "crashed", Host: host, PID: gone.Process.Pid}, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	inst, err := instance.Join(t.Context(), instance.Config{DB: db, ID: "crashed", Host: host})
	if err != nil {
		t.Fatalf("restart after a crash: %v", err)
	}
	defer inst.Leave(context.Background())
	if row := inst.Row(); row.PID != os.Getpid() {
		t.Fatalf("row %+v", row)
	}
	// This process runs: a second Join under its ID is refused.
	if _, err := instance.Join(t.Context(), instance.Config{DB: db, ID: "crashed", Host: host}); !errors.Is(err, storage.ErrConflict) {
		t.Fatalf("a second process under a live ID: %v", err)
	}
	// Another host's live row is never taken.
	if _, err := db.RegisterInstance(t.Context(), storage.ServerInstance{ID: "remote", Host: "elsewhere", PID: gone.Process.Pid}, time.Hour, false); err != nil {
		t.Fatal(err)
	}
	if _, err := instance.Join(t.Context(), instance.Config{DB: db, ID: "remote", Host: host}); !errors.Is(err, storage.ErrConflict) {
		t.Fatalf("another host's live instance: %v", err)
	}
}
