package scheduler_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// Job loops of several server instances on one PostgreSQL database
// (README "Several instances", docs/protocol/jobs.md §12.6).

// registerInstance gives instance id a live row (a lease of an hour) in
// db, as server/instance does for a server process.
func registerInstance(t *testing.T, db *storage.DB, id string) {
	t.Helper()
	if _, err := db.RegisterInstance(t.Context(), storage.ServerInstance{ID: id, Host: "test"}, time.Hour, false); err != nil {
		t.Fatal(err)
	}
}

// instanceLoop is the job loop of instance id (registered), on a
// connection pool of its own to first's database, serving first's
// project: another server process.
func instanceLoop(t *testing.T, dbURL string, first *loopEnv, id string, reg *prometheus.Registry) *loopEnv {
	t.Helper()
	db := testworld.Open(t, dbURL)
	registerInstance(t, db, id)
	sched := scheduler.New(db, scheduler.Config{InstanceID: id, Tick: 20 * time.Millisecond, Metrics: reg,
		Logger: slog.New(slog.DiscardHandler)})
	if err := sched.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Close)
	t.Cleanup(func() {
		if err := sched.CheckJobStates(); err != nil {
			t.Error(err)
		}
	})
	return &loopEnv{t: t, db: db, sched: sched, project: first.project, cache: first.cache, secrets: first.secrets}
}

// openAssignments reads the open assignments by job ID.
func openAssignments(t *testing.T, db *storage.DB) map[string]storage.OpenAssignment {
	t.Helper()
	open, err := jobqueue.New(db).OpenAssignments(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]storage.OpenAssignment{}
	for _, a := range open {
		out[a.JobID] = a
	}
	return out
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

// An instance that starts while another runs a job leaves that job to it:
// the assignment stays open and the other instance's worker completes it.
func TestStartLeavesLiveInstancesJobs(t *testing.T) {
	url := storagetest.PostgresURL(t)
	b := newLoopEnv(t, url, scheduler.Config{InstanceID: "b", Tick: 20 * time.Millisecond})
	registerInstance(t, b.db, "b")
	ev := b.evaluate(leaf("one"))
	wb := b.worker([]string{b.project}, allCaps, x86)
	wb.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	job := wb.mustAssigned("b's worker")

	a := instanceLoop(t, url, b, "a", prometheus.NewRegistry())
	wa := a.worker([]string{a.project}, allCaps, x86)
	wa.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if open := openAssignments(t, a.db)[job.JobID]; open.AssignmentID != job.AssignmentID || open.InstanceID != "b" {
		t.Fatalf("b's assignment after a started: %+v; want still open, b's", open)
	}
	time.Sleep(100 * time.Millisecond) // a few of a's passes
	if got := wa.assigned(); got != nil {
		t.Fatalf("a's worker got %s while b's worker runs it", got.JobID)
	}
	wb.send(&wire.JobCompleted{JobID: job.JobID, AssignmentID: job.AssignmentID})
	if got := b.build(ev.ID); got.Status != storage.BuildSucceeded || got.Attempts != 1 {
		t.Fatalf("build %s after %d attempts; want b's run to count", got.Status, got.Attempts)
	}
}

// When an instance dies (its lease passes) its running job is queued
// again once and handed to a live instance's idle worker; the dead
// instance, only paused, tells its worker to abort when it runs again,
// and that worker's late report changes nothing.
func TestDeadInstancesJobGoesToALiveInstance(t *testing.T) {
	url := storagetest.PostgresURL(t)
	regB := prometheus.NewRegistry()
	b := newLoopEnv(t, url, scheduler.Config{InstanceID: "b", Tick: 20 * time.Millisecond, Metrics: regB})
	registerInstance(t, b.db, "b")
	ev := b.evaluate(leaf("one"))
	wb := b.worker([]string{b.project}, allCaps, x86)
	wb.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	job := wb.mustAssigned("b's worker")

	regA, regC := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := instanceLoop(t, url, b, "a", regA)
	instanceLoop(t, url, b, "c", regC) // a second live instance recovering at the same time, without workers
	wa := a.worker([]string{a.project}, allCaps, x86)
	wa.send(&wire.RequestJob{Kind: wire.JobKindBuild})

	if _, err := b.db.RenewInstance(t.Context(), "b", time.Millisecond); err != nil { // b's lease passes
		t.Fatal(err)
	}
	var again *wire.AssignJob
	waitfor.True(t, "b's job assigned to a's idle worker", func() bool {
		again = wa.assigned()
		return again != nil
	})
	if again.JobID != job.JobID || again.AssignmentID == job.AssignmentID {
		t.Fatalf("a's worker got %s/%s, want b's job %s under a new assignment", again.JobID, again.AssignmentID, job.JobID)
	}
	if n := counter(t, regA, "gradient_scheduler_instance_lost_jobs_total") + counter(t, regC, "gradient_scheduler_instance_lost_jobs_total"); n != 1 {
		t.Fatalf("a and c re-queued %v jobs of b between them, want 1", n)
	}
	if open := openAssignments(t, a.db)[job.JobID]; open.AssignmentID != again.AssignmentID || open.InstanceID != "a" {
		t.Fatalf("open assignment of the job: %+v, want a's", open)
	}

	// b runs again (it was paused): its pass finds the job taken over.
	waitfor.True(t, "b's worker told to abort", func() bool {
		for {
			select {
			case m := <-wb.sent:
				if ab, ok := m.(*wire.AbortJob); ok && ab.JobID == job.JobID {
					return true
				}
			default:
				return false
			}
		}
	})
	wb.send(&wire.JobCompleted{JobID: job.JobID, AssignmentID: job.AssignmentID})
	if got := b.build(ev.ID); got.Status != storage.BuildBuilding {
		t.Fatalf("build %s after b's worker's late report, want still building on a's worker", got.Status)
	}
	wa.send(&wire.JobCompleted{JobID: again.JobID, AssignmentID: again.AssignmentID})
	if got := a.build(ev.ID); got.Status != storage.BuildSucceeded || got.Attempts != 1 {
		t.Fatalf("build %s after %d attempts; want succeeded, b's lost run not counted", got.Status, got.Attempts)
	}
	if n := counter(t, regB, "gradient_scheduler_assignments_taken_over_total"); n != 1 {
		t.Fatalf("b counted %v assignments taken over, want 1", n)
	}
}

func noteCount(t *testing.T, reg *prometheus.Registry, event string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "gradient_scheduler_notes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" && l.GetValue() == event {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// An instance alone on its database tells nobody about its work (no
// note nobody hears on every queued build); once another instance's row
// is live, its next pass turns the notes on.
func TestAloneInstanceSendsNoNotes(t *testing.T) {
	url := storagetest.PostgresURL(t)
	base := newLoopEnv(t, url, scheduler.Config{})
	reg := prometheus.NewRegistry()
	a := instanceLoop(t, url, base, "inst-a", reg)
	waitfor.True(t, "inst-a finding itself alone", a.sched.Alone)
	a.evaluate(leaf("alone"))
	time.Sleep(200 * time.Millisecond) // many note windows (2 ms)
	if n := noteCount(t, reg, "sent"); n != 0 {
		t.Fatalf("an instance alone sent %v notes", n)
	}

	registerInstance(t, a.db, "inst-b")
	waitfor.True(t, "inst-a seeing inst-b", func() bool { return !a.sched.Alone() })
	a.evaluate(leaf("together"))
	waitfor.True(t, "a note about the build queued with inst-b live", func() bool { return noteCount(t, reg, "sent") > 0 })
}
