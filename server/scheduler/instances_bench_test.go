package scheduler_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/authority/authoritytest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// BenchmarkDeadInstanceRequeue measures the time from a server instance's
// death to its running job assigned to another instance's idle worker,
// with the defaults: the dead instance's last renewal gave it
// instance.DefaultLease (30 s), and the live instance's pass runs every
// scheduler Tick (5 s). It is measured from the last renewal, the worst
// case: a death just before the next renewal (5 s later,
// instance.DefaultRenewEvery) is noticed that much sooner. Reported as
// s/recovery; about 30 s plus up to one pass. Run it alone:
//
//	go test -run '^$' -bench DeadInstanceRequeue -benchtime 1x ./server/scheduler
func BenchmarkDeadInstanceRequeue(b *testing.B) {
	var total time.Duration
	for range b.N {
		b.StopTimer()
		measure := benchInstanceEnv(b, storagetest.PostgresURLOrSkip(b))
		b.StartTimer()
		total += measure()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/recovery")
}

// benchInstanceEnv claims a job for a dead-to-be instance, starts a live
// instance's job loop with defaults and an idle worker, and returns the
// measurement: the time from the dead instance's last renewal to the
// job's AssignJob on the live instance's worker.
func benchInstanceEnv(b *testing.B, url string) func() time.Duration {
	b.Helper()
	ctx := b.Context()
	db := testworld.Open(b, url)
	p, _ := testworld.Project(b, db, "https://example.invalid/p.git")
	project := p.ID
	q := jobqueue.New(db)
	ev, err := q.CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: project, RepositoryURL: "https://example.invalid/p.git", Commit: benchCommit})
	if err != nil {
		b.Fatal(err)
	}
	pending, err := q.PendingJobs(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var job string
	for _, j := range pending {
		if j.EvaluationID == ev.ID {
			job = j.JobID
		}
	}
	dead, live := "dead-"+storage.NewID(), "live-"+storage.NewID()
	for _, id := range []string{dead, live} {
		if _, err := db.RegisterInstance(ctx, storage.ServerInstance{ID: id, Host: "bench"}, instance.DefaultLease, false); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := jobqueue.New(db, jobqueue.ForInstance(dead)).ClaimJob(ctx, job, storage.NewID()); err != nil {
		b.Fatal(err)
	}
	lastRenewal := time.Now()
	sched := scheduler.New(db, scheduler.Config{InstanceID: live, Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry()})
	if err := sched.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sched.Close)
	stop := make(chan struct{})
	b.Cleanup(func() { close(stop) })
	go func() { // the live instance renews its own lease
		tick := time.NewTicker(instance.DefaultRenewEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				db.RenewInstance(ctx, live, instance.DefaultLease)
			}
		}
	}()
	sent := make(chan wire.ServerMessage, 64)
	w := authoritytest.NewLiveWorker(storage.NewID(), map[string]authority.Abilities{project: everything}, allCaps, x86,
		func(m wire.ServerMessage) error { sent <- m; return nil })
	sched.SessionStarted(w)
	sched.HandleJobMessage(w, &wire.RequestJob{Kind: wire.JobKindFlake})
	return func() time.Duration {
		deadline := time.After(3 * instance.DefaultLease)
		for {
			select {
			case m := <-sent:
				if a, ok := m.(*wire.AssignJob); ok && a.JobID == job {
					return time.Since(lastRenewal)
				}
			case <-deadline:
				b.Fatalf("the dead instance's job was not assigned within %s", 3*instance.DefaultLease)
			}
		}
	}
}
