package jobqueue

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/storage"
)

// instanceQueue registers a live server instance id (lease of an hour)
// and returns the queue that claims for it.
func instanceQueue(t testing.TB, db *testDB, id string) *Queue {
	t.Helper()
	if _, err := db.RegisterInstance(t.Context(), storage.ServerInstance{ID: id, Host: "test"}, time.Hour, false); err != nil {
		t.Fatalf("RegisterInstance(%s): %v", id, err)
	}
	return New(db.DB, ForInstance(id))
}

// expireInstance lets id's lease pass without deleting its row: the
// instance crashed (or paused longer than its lease).
func expireInstance(t testing.TB, db *testDB, id string) {
	t.Helper()
	if _, err := db.RenewInstance(t.Context(), id, time.Millisecond); err != nil {
		t.Fatalf("RenewInstance(%s): %v", id, err)
	}
	time.Sleep(3 * time.Millisecond) // past the lease on the database's clock
}

func openByJob(t testing.TB, db *testDB) map[string]storage.OpenAssignment {
	t.Helper()
	open, err := db.OpenAssignments(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]storage.OpenAssignment{}
	for _, a := range open {
		out[a.JobID] = a
	}
	return out
}

// Recovery at an instance's start closes its own previous run's and the
// ownerless assignments, not a live instance's; a dead instance's are
// re-queued once by a live one, and its late report is refused.
// (PostgreSQL: SQLite is one process, TestSQLiteStartRecoversEverything.)
func TestRecoveryKeepsLiveInstancesWork(t *testing.T) {
	t.Parallel()
	func(t *testing.T, db *testDB) {
		ctx := t.Context()
		a, b, c := instanceQueue(t, db, "a"), instanceQueue(t, db, "b"), instanceQueue(t, db, "c")
		worker := storage.NewID()
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, worker,
			discovered("x", "x"), discovered("y", "y"), discovered("z", "z"), discovered("w", "w"))
		claim := func(q *Queue, name string) string {
			t.Helper()
			id, err := q.ClaimJob(ctx, ready[drvPath(name)].JobID, worker)
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		onA, onB := claim(a, "x"), claim(b, "y")
		ownerless := claim(db.Queue, "z")
		onC := claim(c, "w")
		open := openByJob(t, db)
		for name, want := range map[string]string{"x": "a", "y": "b", "z": "", "w": "c"} {
			if got := open[ready[drvPath(name)].JobID]; got.InstanceID != want {
				t.Fatalf("assignment of %s names instance %q, want %q", name, got.InstanceID, want)
			}
		}

		// a restarts: its own and the ownerless assignment, not b's or c's.
		if n, err := a.RecoverInterruptedWork(ctx); err != nil || n != 2 {
			t.Fatalf("a's recovery at start = %d, %v; want 2 (its own, the ownerless one)", n, err)
		}
		open = openByJob(t, db)
		if len(open) != 2 || open[ready[drvPath("y")].JobID].AssignmentID != onB || open[ready[drvPath("w")].JobID].AssignmentID != onC {
			t.Fatalf("open after a's start: %+v; want b's and c's untouched", open)
		}
		for _, id := range []string{onA, ownerless} {
			if _, err := a.CompleteBuild(ctx, id, nil); !errors.Is(err, storage.ErrConflict) {
				t.Fatalf("completion under a recovered assignment: %v, want ErrConflict", err)
			}
		}
		if lost, err := a.RecoverDeadInstances(ctx); err != nil || len(lost) != 0 {
			t.Fatalf("RecoverDeadInstances with every instance live = %+v, %v", lost, err)
		}

		// b crashes (its lease passes), c stops cleanly (its row is gone).
		expireInstance(t, db, "b")
		if err := db.DeleteInstance(ctx, "c"); err != nil {
			t.Fatal(err)
		}
		dead, err := a.DeadInstancesHolding(ctx)
		if slices.Sort(dead); err != nil || !slices.Equal(dead, []string{"b", "c"}) {
			t.Fatalf("DeadInstancesHolding = %v, %v; want [b c]", dead, err)
		}
		lost, err := a.RecoverDeadInstances(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(lost, func(x, y LostInstance) int { return strings.Compare(x.ID, y.ID) })
		if len(lost) != 2 || lost[0].ID != "b" || !slices.Equal(lost[0].Jobs, []string{ready[drvPath("y")].JobID}) ||
			lost[1].ID != "c" || !slices.Equal(lost[1].Jobs, []string{ready[drvPath("w")].JobID}) {
			t.Fatalf("RecoverDeadInstances = %+v; want b's y and c's w", lost)
		}
		if again, err := a.RecoverDeadInstances(ctx); err != nil || len(again) != 0 {
			t.Fatalf("second RecoverDeadInstances = %+v, %v; want nothing", again, err)
		}
		if b := buildByDrv(t, db, e.ID, "y"); b.Status != storage.BuildQueued || b.Attempts != 0 {
			t.Fatalf("recovered build %s, %d attempts; want queued, the attempt not counted", b.Status, b.Attempts)
		}
		// b was only paused: its worker's completion comes late and is
		// refused, not recorded beside the next run of the job.
		if _, err := b.CompleteBuild(ctx, onB, nil); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("late completion of a recovered assignment: %v, want ErrConflict", err)
		}
		if _, _, err := b.FailJob(ctx, onB, storage.FailurePermanent, "late", 3); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("late failure of a recovered assignment: %v, want ErrConflict", err)
		}
		if b := buildByDrv(t, db, e.ID, "y"); b.Status != storage.BuildQueued {
			t.Fatalf("build after the late reports: %s, want queued", b.Status)
		}
		if n := len(allPending(t, db)); n != 4 {
			t.Fatalf("%d pending jobs, want all 4 builds", n)
		}
		// Every job runs to its end on a.
		for _, j := range allPending(t, db) {
			buildOK(t, &testDB{a, db.DB}, j, worker)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded)
		var outcomes []string
		rows, err := db.Base().SQL().QueryContext(ctx, `SELECT outcome FROM job_assignments WHERE instance_id IN ('b', 'c') ORDER BY outcome`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var o string
			rows.Scan(&o)
			outcomes = append(outcomes, o)
		}
		rows.Close()
		if !slices.Equal(outcomes, []string{OutcomeInstanceLost, OutcomeInstanceLost}) {
			t.Fatalf("outcomes of the dead instances' assignments: %v", outcomes)
		}
	}(t, openTestDB(t, freshPostgresURL(t)))
}

// On SQLite, one server process by design, a start recovers every open
// assignment, whatever instance it names: a restart under a new random
// instance ID right after a crash, before the old lease passed, finds
// its predecessor's work at once.
func TestSQLiteStartRecoversEverything(t *testing.T) {
	t.Parallel()
	db := openTestDB(t, freshSQLiteURL(t))
	ctx := t.Context()
	before, after := instanceQueue(t, db, "before-crash"), instanceQueue(t, db, "after-restart")
	worker := storage.NewID()
	e := newEvaluation(t, db)
	ready := startEvaluation(t, db, e.ID, worker, discovered("x", "x"), discovered("y", "y"))
	for _, j := range ready {
		if _, err := before.ClaimJob(ctx, j.JobID, worker); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := after.RecoverInterruptedWork(ctx); err != nil || n != 2 {
		t.Fatalf("RecoverInterruptedWork after a restart under a new ID = %d, %v; want both assignments", n, err)
	}
	if n := len(allPending(t, db)); n != 2 {
		t.Fatalf("%d pending jobs after the restart, want 2", n)
	}
}

// Two live instances recovering one dead instance's work at the same
// moment re-queue each of its jobs exactly once between them.
func TestConcurrentRecoveriesRequeueOnce(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		queues := []*Queue{instanceQueue(t, db, "a"), instanceQueue(t, db, "b")}
		dead := instanceQueue(t, db, "dead")
		worker := storage.NewID()
		project := newEvaluation(t, db).ProjectID
		for round := range 3 {
			e := newEvaluationIn(t, db, project)
			var drvs []storage.DiscoveredBuild
			// Enough that the two recoveries' transactions overlap.
			for i := range 120 {
				drvs = append(drvs, discovered(fmt.Sprintf("r%d-%d", round, i), ""))
			}
			var claimed []string
			for _, j := range startEvaluation(t, db, e.ID, worker, drvs...) {
				if _, err := dead.ClaimJob(ctx, j.JobID, worker); err != nil {
					t.Fatal(err)
				}
				claimed = append(claimed, j.JobID)
			}
			if round == 0 {
				expireInstance(t, db, "dead")
			}
			// round 1: the dead instance claimed after its lease passed
			// (it was paused and does not know yet): recovered all the same.
			results := make([][]LostInstance, len(queues))
			var wg sync.WaitGroup
			for i, q := range queues {
				wg.Go(func() {
					var err error
					if results[i], err = q.RecoverDeadInstances(ctx); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			var got []string
			for _, r := range results {
				for _, l := range r {
					if l.ID != "dead" {
						t.Fatalf("recovered instance %q", l.ID)
					}
					got = append(got, l.Jobs...)
				}
			}
			slices.Sort(got)
			slices.Sort(claimed)
			if !slices.Equal(got, claimed) {
				t.Fatalf("round %d: recovered %d jobs (%d distinct claimed): each must be recovered once", round, len(got), len(claimed))
			}
			if n := len(openByJob(t, db)); n != 0 {
				t.Fatalf("%d assignments still open", n)
			}
		}
	})
}
