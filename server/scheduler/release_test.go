package scheduler_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// refuseReleases makes the database refuse to close assignments, as a
// database that fails mid-operation would, until the returned function
// runs: a trigger, added through a connection of the test's own.
func refuseReleases(t *testing.T, dbURL string) (allow func()) {
	t.Helper()
	ctx := t.Context()
	var raw *sql.DB
	var err error
	var create, drop []string
	if path, ok := strings.CutPrefix(dbURL, "sqlite://"); ok {
		raw, err = sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
		create = []string{`CREATE TRIGGER refuse_release BEFORE UPDATE OF closed_at ON job_assignments
			BEGIN SELECT RAISE(ABORT, 'injected: the database refuses releases'); END`}
		drop = []string{`DROP TRIGGER refuse_release`}
	} else {
		raw, err = sql.Open("pgx", dbURL)
		create = []string{
			`CREATE FUNCTION refuse_release() RETURNS trigger LANGUAGE plpgsql AS
			 $$ BEGIN RAISE EXCEPTION 'injected: the database refuses releases'; END $$`,
			`CREATE TRIGGER refuse_release BEFORE UPDATE OF closed_at ON job_assignments
			 FOR EACH ROW EXECUTE FUNCTION refuse_release()`,
		}
		drop = []string{`DROP TRIGGER refuse_release ON job_assignments`, `DROP FUNCTION refuse_release()`}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	for _, q := range create {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		for _, q := range drop {
			if _, err := raw.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// releaseFailures reads gradient_scheduler_release_failures_total.
func releaseFailures(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "gradient_scheduler_release_failures_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// engines are the database URLs the release tests run on.
var engines = map[string]func(testing.TB) string{"sqlite": storagetest.SQLiteURL, "postgres": storagetest.PostgresURL}

// A declined job whose release the database refuses is not lost: once
// the database takes releases again, a pass returns it to the queue and
// another worker gets it.
func TestDeclinedJobSurvivesAFailedRelease(t *testing.T) {
	reason := "at capacity (1/1)"
	releaseFailsThenHeals(t, func(e *loopEnv, first *testWorker, a *wire.AssignJob) {
		first.send(&wire.AssignJobResponse{JobID: a.JobID, Accepted: false, Reason: &reason})
	})
}

// A lost worker's job whose release the database refuses is not lost
// either.
func TestLostWorkersJobSurvivesAFailedRelease(t *testing.T) {
	releaseFailsThenHeals(t, func(e *loopEnv, first *testWorker, _ *wire.AssignJob) {
		e.sched.SessionEnded(first.live, "connection lost")
	})
}

// releaseFailsThenHeals assigns a build to a first worker, makes the
// database refuse releases while giveBack hands the job back, and checks,
// on each engine, that a second worker gets it only once the database
// takes releases again.
func releaseFailsThenHeals(t *testing.T, giveBack func(e *loopEnv, first *testWorker, a *wire.AssignJob)) {
	for engine, dbURL := range engines {
		t.Run(engine, func(t *testing.T) {
			url := dbURL(t)
			reg := prometheus.NewRegistry()
			e := newLoopEnv(t, url, scheduler.Config{Tick: 20 * time.Millisecond, Metrics: reg})
			e.evaluate(leaf("one"))
			first := e.worker([]string{e.project}, allCaps, x86)
			first.send(&wire.RequestJob{Kind: wire.JobKindBuild})
			a := first.mustAssigned("first worker")

			allow := refuseReleases(t, url)
			giveBack(e, first, a)
			second := e.worker([]string{e.project}, allCaps, x86)
			second.send(&wire.RequestJob{Kind: wire.JobKindBuild})
			if b := second.assigned(); b != nil {
				t.Fatalf("job %s assigned although its first assignment is still open", b.JobID)
			}
			if n := releaseFailures(t, reg); n < 1 {
				t.Errorf("%v release failures counted, want at least 1", n)
			}

			allow()
			var b *wire.AssignJob
			waitfor.True(t, "the job handed back assigned to the second worker", func() bool {
				b = second.assigned()
				return b != nil
			})
			if b.JobID != a.JobID || b.AssignmentID == a.AssignmentID {
				t.Errorf("re-assignment %s/%s, want job %s under a fresh assignment", b.JobID, b.AssignmentID, a.JobID)
			}
		})
	}
}
