package jobqueue

import (
	"strings"
	"testing"

	"gradient.dev/gradient/storage"
)

// A build whose workers keep getting lost fails for good at the limit,
// failing its dependents; a report from a worker starts the count again
// (docs/protocol/jobs.md §12.4).
func TestLostWorkersFailAJobAtTheLimit(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		const maxLost = 3
		e := newEvaluation(t, db)
		worker := storage.NewID()
		ready := startEvaluation(t, db, e.ID, worker, discovered("lib", ""), discovered("app", "packages.x86_64-linux.app", "lib"))
		lib := ready[drvPath("lib")]
		lose := func(want bool) {
			t.Helper()
			a := mustClaim(t, db, lib.JobID, worker)
			failed, err := db.ReleaseLostAssignment(ctx, a, maxLost)
			if err != nil || failed != want {
				t.Fatalf("ReleaseLostAssignment = %v, %v; want failed %v", failed, err, want)
			}
			if again, err := db.ReleaseLostAssignment(ctx, a, maxLost); err != nil || again {
				t.Fatalf("releasing a closed assignment: %v, %v", again, err)
			}
		}
		lose(false)
		// The worker of the next attempt reports: the count starts over.
		a := mustClaim(t, db, lib.JobID, worker)
		if _, _, err := db.FailJob(ctx, a, storage.FailureTransient, "network blip", 10); err != nil {
			t.Fatal(err)
		}
		lose(false)
		lose(false)
		if b := buildByDrv(t, db, e.ID, "lib"); b.Status != storage.BuildQueued || b.Attempts != 1 {
			t.Fatalf("lib after lost workers: %s, %d attempts; want queued, only the reported attempt counted", b.Status, b.Attempts)
		}
		lose(true)
		b := buildByDrv(t, db, e.ID, "lib")
		if b.Status != storage.BuildFailed || b.FailureKind != storage.FailurePermanent || !strings.Contains(b.Error, "3 workers in a row were lost") {
			t.Fatalf("lib after %d lost workers in a row: %s/%s %q", maxLost, b.Status, b.FailureKind, b.Error)
		}
		if app := buildByDrv(t, db, e.ID, "app"); app.Status != storage.BuildDependencyFailed {
			t.Fatalf("app: %s, want dependency failed", app.Status)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationFailed)
	})
}
