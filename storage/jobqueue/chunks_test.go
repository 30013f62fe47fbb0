package jobqueue

import (
	"fmt"
	"slices"
	"testing"

	"gradient.dev/gradient/storage"
)

// An evaluation's ready builds are queued in chunks: the flake job's
// completion queues the first, ReadyCandidates and QueueReadyBuilds the
// rest; builds with unbuilt inputs stay waiting.
func TestReadyBuildsInChunks(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		ev := newEvaluation(t, db)
		flake := mustClaim(t, db, flakeJob(t, db, ev.ID).JobID, storage.NewID())
		var drvs []storage.DiscoveredBuild
		for i := range 25 {
			drvs = append(drvs, discovered(fmt.Sprintf("leaf%02d", i), ""))
		}
		drvs = append(drvs, discovered("top", "top", "leaf00", "leaf01"))
		if err := db.AddDiscoveredDerivations(ctx, ev.ID, drvs); err != nil {
			t.Fatal(err)
		}
		first, evalID, more, err := db.CompleteFlakeJobChunk(ctx, flake, 10)
		if err != nil || evalID != ev.ID || !more || len(first) != 10 {
			t.Fatalf("CompleteFlakeJobChunk = %d jobs, %s, more %v, %v; want 10 of %s and more", len(first), evalID, more, err, ev.ID)
		}
		wantEvalStatus(t, db, ev.ID, storage.EvaluationBuilding)
		rest, err := db.ReadyCandidates(ctx, ev.ID)
		if err != nil || len(rest) != 15 {
			t.Fatalf("ReadyCandidates = %d, %v; want the 15 other leaves", len(rest), err)
		}
		second, err := db.QueueReadyBuilds(ctx, ev.ID, rest[:8])
		if err != nil || len(second) != 8 {
			t.Fatalf("QueueReadyBuilds = %d jobs, %v; want 8", len(second), err)
		}
		// Queued already, or not ready: nothing happens to them.
		top := buildByDrv(t, db, ev.ID, "top")
		again, err := db.QueueReadyBuilds(ctx, ev.ID, append(slices.Clone(rest[:8]), top.ID))
		if err != nil || len(again) != 0 {
			t.Fatalf("QueueReadyBuilds of queued and unready builds = %v, %v; want none", again, err)
		}
		third, err := db.QueueReadyBuilds(ctx, ev.ID, rest[8:])
		if err != nil || len(third) != 7 {
			t.Fatalf("QueueReadyBuilds = %d jobs, %v; want 7", len(third), err)
		}
		if got := len(allPending(t, db)); got != 25 {
			t.Fatalf("%d pending jobs, want the 25 leaves", got)
		}
		if b := buildByDrv(t, db, ev.ID, "top"); b.Status != storage.BuildWaiting {
			t.Fatalf("top is %s, want waiting", b.Status)
		}
		if left, err := db.ReadyCandidates(ctx, ev.ID); err != nil || len(left) != 0 {
			t.Fatalf("ReadyCandidates after all = %v, %v", left, err)
		}
	})
}

// A server that stops after the first chunk leaves the rest waiting; the
// next start queues them (no build lost, none queued twice).
func TestRecoveryQueuesTheRestOfAChunkedReadying(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		ev := newEvaluation(t, db)
		flake := mustClaim(t, db, flakeJob(t, db, ev.ID).JobID, storage.NewID())
		var drvs []storage.DiscoveredBuild
		for i := range 30 {
			drvs = append(drvs, discovered(fmt.Sprintf("b%02d", i), ""))
		}
		if err := db.AddDiscoveredDerivations(ctx, ev.ID, drvs); err != nil {
			t.Fatal(err)
		}
		if first, _, more, err := db.CompleteFlakeJobChunk(ctx, flake, 12); err != nil || len(first) != 12 || !more {
			t.Fatalf("CompleteFlakeJobChunk = %d, more %v, %v", len(first), more, err)
		}
		if _, err := db.RecoverInterruptedWork(ctx); err != nil {
			t.Fatal(err)
		}
		pending := allPending(t, db)
		builds := map[string]bool{}
		for _, j := range pending {
			if builds[j.BuildID] {
				t.Fatalf("build %s has two pending jobs", j.BuildID)
			}
			builds[j.BuildID] = true
		}
		if len(pending) != 30 {
			t.Fatalf("%d pending jobs after the restart, want 30", len(pending))
		}
	})
}

// CompleteBuildDeferEnd leaves the evaluation's end to its caller:
// EndEvaluationIfDone ends it once no build is left, and not before.
func TestCompleteBuildDeferEnd(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		worker := storage.NewID()
		ev := newEvaluation(t, db)
		ready := startEvaluation(t, db, ev.ID, worker, discovered("a", "a"), discovered("b", "b"))
		for i, name := range []string{"a", "b"} {
			a := mustClaim(t, db, ready[drvPath(name)].JobID, worker)
			if _, err := db.CompleteBuildDeferEnd(ctx, a, nil); err != nil {
				t.Fatal(err)
			}
			wantEvalStatus(t, db, ev.ID, storage.EvaluationBuilding)
			ended, err := db.EndEvaluationIfDone(ctx, ev.ID)
			if err != nil || ended != (i == 1) {
				t.Fatalf("EndEvaluationIfDone after %d of 2 builds = %v, %v", i+1, ended, err)
			}
		}
		wantEvalStatus(t, db, ev.ID, storage.EvaluationSucceeded)
		if ended, err := db.EndEvaluationIfDone(ctx, ev.ID); err != nil || ended {
			t.Fatalf("EndEvaluationIfDone of an ended evaluation = %v, %v", ended, err)
		}
		ids, err := db.PendingJobIDs(ctx)
		if err != nil || len(ids) != 0 {
			t.Fatalf("PendingJobIDs = %v, %v; want none", ids, err)
		}
	})
}
