package scheduler_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// refuseReleases makes the database refuse to close assignments, as a
// database that fails mid-operation would, until the returned function
// runs. It opens the SQLite file beside the scheduler's connection pool.
func refuseReleases(t *testing.T, dbURL string) (allow func()) {
	t.Helper()
	raw, err := sql.Open("sqlite", strings.TrimPrefix(dbURL, "sqlite://")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	if _, err := raw.ExecContext(t.Context(), `CREATE TRIGGER refuse_release BEFORE UPDATE OF closed_at ON job_assignments
		BEGIN SELECT RAISE(ABORT, 'injected: the database refuses releases'); END`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := raw.ExecContext(t.Context(), `DROP TRIGGER refuse_release`); err != nil {
			t.Fatal(err)
		}
	}
}

// A declined job whose release the database refuses is not lost: once
// the database takes releases again, a pass returns it to the queue and
// another worker gets it.
func TestDeclinedJobSurvivesAFailedRelease(t *testing.T) {
	url := storagetest.SQLiteURL(t)
	e := newLoopEnv(t, url, scheduler.Config{Tick: 20 * time.Millisecond})
	e.evaluate(leaf("one"))
	first := e.worker([]string{e.project}, allCaps, x86)
	first.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := first.mustAssigned("first worker")

	allow := refuseReleases(t, url)
	reason := "at capacity (1/1)"
	first.send(&wire.AssignJobResponse{JobID: a.JobID, Accepted: false, Reason: &reason})
	second := e.worker([]string{e.project}, allCaps, x86)
	second.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if b := second.assigned(); b != nil {
		t.Fatalf("job %s assigned although its first assignment is still open", b.JobID)
	}

	allow()
	var b *wire.AssignJob
	waitfor.True(t, "the declined job assigned to the second worker", func() bool {
		b = second.assigned()
		return b != nil
	})
	if b.JobID != a.JobID || b.AssignmentID == a.AssignmentID {
		t.Errorf("re-assignment %s/%s, want job %s under a fresh assignment", b.JobID, b.AssignmentID, a.JobID)
	}
}

// A lost worker's job whose release the database refuses is retried
// the same way.
func TestLostWorkersJobSurvivesAFailedRelease(t *testing.T) {
	url := storagetest.SQLiteURL(t)
	e := newLoopEnv(t, url, scheduler.Config{Tick: 20 * time.Millisecond})
	e.evaluate(leaf("one"))
	first := e.worker([]string{e.project}, allCaps, x86)
	first.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := first.mustAssigned("first worker")

	allow := refuseReleases(t, url)
	e.sched.SessionEnded(first.live, "connection lost")
	second := e.worker([]string{e.project}, allCaps, x86)
	second.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if b := second.assigned(); b != nil {
		t.Fatalf("job %s assigned although its first assignment is still open", b.JobID)
	}

	allow()
	var b *wire.AssignJob
	waitfor.True(t, "the lost worker's job assigned to the second worker", func() bool {
		b = second.assigned()
		return b != nil
	})
	if b.JobID != a.JobID {
		t.Errorf("re-assignment of job %s, want %s", b.JobID, a.JobID)
	}
}
