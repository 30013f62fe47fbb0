package jobqueue

import (
	"slices"
	"testing"

	"gradient.dev/gradient/storage"
)

// Builds stream while their evaluation evaluates: a batch's builds whose
// inputs all have succeeded builds (here or in an earlier evaluation)
// are queued at once; one whose input is not reported yet waits, and is
// queued when that input is built. A failed evaluation stops them.
func TestStreamedBuilds(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		earlier := newEvaluation(t, db)
		old := startEvaluation(t, db, earlier.ID, storage.NewID(), discovered("old", "packages.x.old"))
		buildOK(t, db, old[drvPath("old")], storage.NewID())

		e := newEvaluationIn(t, db, earlier.ProjectID)
		flake := mustClaim(t, db, flakeJob(t, db, e.ID).JobID, storage.NewID())
		// a needs b, reported in a later batch; k needs old, which an
		// earlier evaluation built (the worker was told it is known).
		first := []storage.DiscoveredBuild{discovered("a", "packages.x.a", "b"), discovered("c", "packages.x.c"), discovered("k", "packages.x.k", "old")}
		if err := db.AddDiscoveredDerivations(ctx, e.ID, first); err != nil {
			t.Fatal(err)
		}
		ready, err := db.QueueStreamedBuilds(ctx, e.ID, []string{drvPath("a"), drvPath("c"), drvPath("k")})
		if err != nil {
			t.Fatal(err)
		}
		jobs := pendingOf(t, db, ready)
		if len(jobs) != 2 || jobs[drvPath("c")].JobID == "" || jobs[drvPath("k")].JobID == "" {
			t.Fatalf("first batch queued %v, want c and k (a's input is not reported yet)", keys(jobs))
		}
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{discovered("b", "")}); err != nil {
			t.Fatal(err)
		}
		ready, err = db.QueueStreamedBuilds(ctx, e.ID, []string{drvPath("b")})
		if err != nil {
			t.Fatal(err)
		}
		b := pendingOf(t, db, ready)
		if len(b) != 1 || b[drvPath("b")].JobID == "" {
			t.Fatalf("second batch queued %v, want b", keys(b))
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationFetching) // its flake job still runs
		if next := buildOK(t, db, b[drvPath("b")], storage.NewID()); len(next) != 1 || next[drvPath("a")].JobID == "" {
			t.Fatalf("after b, while evaluating: %v, want a", keys(next))
		}

		// The evaluation fails: its streamed builds stop, running or not.
		running := mustClaim(t, db, jobs[drvPath("c")].JobID, storage.NewID())
		if _, _, err := db.FailJob(ctx, flake, storage.FailurePermanent, "evaluation broke", 1); err != nil {
			t.Fatal(err)
		}
		open, stopped, err := db.StopEvaluationBuilds(ctx, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(open) != 1 || open[0].AssignmentID != running || stopped != 3 {
			t.Fatalf("stopped %d jobs, open %+v; want a, c (running) and k", stopped, open)
		}
		for _, j := range allPending(t, db) {
			if j.EvaluationID == e.ID {
				t.Errorf("job %s of the failed evaluation still pending", j.JobID)
			}
		}
		if _, err := db.CompleteBuild(ctx, running, nil); err == nil {
			t.Error("the stopped build's completion was accepted")
		}
	})
}

// EvaluationBuildsPastWaiting lists what a progress display prints while
// the evaluation discovers: the streamed builds, not the waiting ones.
func TestEvaluationBuildsPastWaiting(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		mustClaim(t, db, flakeJob(t, db, e.ID).JobID, storage.NewID())
		batch := []storage.DiscoveredBuild{discovered("a", "packages.x.a", "b"), discovered("c", "packages.x.c"), discovered("b", "packages.x.b")}
		if err := db.AddDiscoveredDerivations(ctx, e.ID, batch); err != nil {
			t.Fatal(err)
		}
		if _, err := db.QueueStreamedBuilds(ctx, e.ID, []string{drvPath("a"), drvPath("b"), drvPath("c")}); err != nil {
			t.Fatal(err)
		}
		got, err := db.EvaluationBuildsPastWaiting(ctx, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		var attrs []string
		for _, b := range got {
			attrs = append(attrs, b.Attr+":"+string(b.Status))
		}
		if want := []string{"packages.x.b:queued", "packages.x.c:queued"}; !slices.Equal(attrs, want) {
			t.Errorf("past waiting: %v, want %v (a waits for b)", attrs, want)
		}
		all, err := db.EvaluationBuilds(ctx, e.ID)
		if err != nil || len(all) != 3 {
			t.Fatalf("all builds: %d, %v; want 3", len(all), err)
		}
	})
}
