package jobqueue

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"gradient.dev/gradient/storage"
)

func drvPath(name string) string { return "/nix/store/" + name + "-hash.drv" }

func outPath(name string) string { return "/nix/store/" + name + "-out" }

// discovered is a derivation named name depending on deps (names).
func discovered(name, attr string, deps ...string) storage.DiscoveredBuild {
	d := storage.DiscoveredBuild{
		Attr: attr, DrvPath: drvPath(name),
		Outputs:      []storage.BuildOutputPath{{Name: "out", Path: outPath(name)}},
		Architecture: "x86_64-linux", RequiredFeatures: []string{"kvm"},
	}
	for _, dep := range deps {
		d.Dependencies = append(d.Dependencies, drvPath(dep))
	}
	return d
}

// newEvaluation makes a project and an evaluation of it.
func newEvaluation(t *testing.T, db *testDB) storage.Evaluation {
	t.Helper()
	team := mustTeam(t, db, "t")
	project := mustProject(t, db, team.ID, "p")
	e, err := db.CreateEvaluation(t.Context(), storage.NewEvaluation{
		ProjectID: project.ID, RepositoryURL: project.Repository, Commit: "abc123",
		Wildcards: []string{"packages.*.*"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// pendingOf returns the pending jobs by drv path ("" for a flake job).
func pendingOf(t *testing.T, db *testDB, ids []string) map[string]storage.PendingJob {
	t.Helper()
	jobs, err := db.PendingJobsByID(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != len(ids) {
		t.Fatalf("PendingJobsByID(%v) = %d jobs", ids, len(jobs))
	}
	out := map[string]storage.PendingJob{}
	for _, j := range jobs {
		out[j.DrvPath] = j
	}
	return out
}

func allPending(t *testing.T, db *testDB) []storage.PendingJob {
	t.Helper()
	jobs, err := db.PendingJobs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return jobs
}

// flakeJob returns the pending flake job of an evaluation.
func flakeJob(t *testing.T, db *testDB, evalID string) storage.PendingJob {
	t.Helper()
	for _, j := range allPending(t, db) {
		if j.Kind == storage.JobFlake && j.EvaluationID == evalID {
			return j
		}
	}
	t.Fatalf("no pending flake job for evaluation %s", evalID)
	return storage.PendingJob{}
}

func mustClaim(t *testing.T, db *testDB, jobID, workerID string) string {
	t.Helper()
	a, err := db.ClaimJob(t.Context(), jobID, workerID)
	if err != nil {
		t.Fatalf("ClaimJob(%s): %v", jobID, err)
	}
	return a
}

func keys(m map[string]storage.PendingJob) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func wantKeys(t *testing.T, what string, got map[string]storage.PendingJob, names ...string) {
	t.Helper()
	var want []string
	for _, n := range names {
		want = append(want, drvPath(n))
	}
	slices.Sort(want)
	if !slices.Equal(keys(got), want) {
		t.Fatalf("%s: ready %v, want %v", what, keys(got), want)
	}
}

func buildByDrv(t *testing.T, db *testDB, evalID, name string) storage.Build {
	t.Helper()
	builds, err := db.EvaluationBuilds(t.Context(), evalID)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range builds {
		if b.DrvPath == drvPath(name) {
			return b
		}
	}
	t.Fatalf("no build %s", name)
	return storage.Build{}
}

func wantEvalStatus(t *testing.T, db *testDB, evalID string, want storage.EvaluationStatus) storage.Evaluation {
	t.Helper()
	e, err := db.Evaluation(t.Context(), evalID)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != want {
		t.Fatalf("evaluation status %s, want %s (error %q)", e.Status, want, e.Error)
	}
	return e
}

// startEvaluation runs an evaluation's flake job with drvs reported, and
// returns the jobs made ready by its completion, by drv path.
func startEvaluation(t *testing.T, db *testDB, evalID, worker string, drvs ...storage.DiscoveredBuild) map[string]storage.PendingJob {
	t.Helper()
	ctx := t.Context()
	a := mustClaim(t, db, flakeJob(t, db, evalID).JobID, worker)
	if err := db.AddDiscoveredDerivations(ctx, evalID, drvs); err != nil {
		t.Fatal(err)
	}
	ready, err := db.CompleteFlakeJob(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return pendingOf(t, db, ready)
}

func buildOK(t *testing.T, db *testDB, job storage.PendingJob, worker string) map[string]storage.PendingJob {
	t.Helper()
	a := mustClaim(t, db, job.JobID, worker)
	ready, err := db.CompleteBuild(t.Context(), a, []storage.BuildOutputInfo{{Name: "out", StorePath: job.Outputs[0].Path, NarSize: 42, NarHash: "sha256:x"}})
	if err != nil {
		t.Fatal(err)
	}
	return pendingOf(t, db, ready)
}

func TestJobQueueHappyPath(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		if e.Status != storage.EvaluationQueued || !slices.Equal(e.Wildcards, []string{"packages.*.*"}) {
			t.Fatalf("new evaluation %+v", e)
		}
		if latest, err := db.LatestEvaluation(ctx, e.ProjectID); err != nil || latest.ID != e.ID {
			t.Fatalf("LatestEvaluation = %+v, %v", latest, err)
		}
		flake := flakeJob(t, db, e.ID)
		if flake.ProjectID != e.ProjectID || flake.Commit != "abc123" || flake.RepositoryURL != e.RepositoryURL ||
			!slices.Equal(flake.Wildcards, e.Wildcards) {
			t.Fatalf("flake job %+v", flake)
		}
		worker := storage.NewID()
		a := mustClaim(t, db, flake.JobID, worker)
		wantEvalStatus(t, db, e.ID, storage.EvaluationFetching)
		if err := db.SetFlakeSource(ctx, e.ID, "/nix/store/src"); err != nil {
			t.Fatal(err)
		}
		if err := db.SetEvaluationStatus(ctx, e.ID, storage.EvaluationEvaluating); err != nil {
			t.Fatal(err)
		}
		// Graph: app → lib → base, tool → base, leaf; app also needs a
		// derivation the server knew already (never reported).
		timeout := uint64(600)
		app := discovered("app", "packages.x86_64-linux.app", "lib", "known")
		app.TimeoutSecs = &timeout
		// Batch one holds dependents before their dependencies.
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{app, discovered("tool", "packages.x86_64-linux.tool", "base")}); err != nil {
			t.Fatal(err)
		}
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{
			discovered("lib", "", "base"), discovered("base", ""), discovered("leaf", "packages.x86_64-linux.leaf"),
		}); err != nil {
			t.Fatal(err)
		}
		builds, err := db.EvaluationBuilds(ctx, e.ID)
		if err != nil || len(builds) != 5 {
			t.Fatalf("EvaluationBuilds = %d, %v", len(builds), err)
		}
		for _, b := range builds {
			if b.Status != storage.BuildWaiting {
				t.Fatalf("build %s is %s before the evaluation ended", b.DrvPath, b.Status)
			}
		}
		if n := len(allPending(t, db)); n != 0 {
			t.Fatalf("%d pending jobs during evaluation", n)
		}
		ready, err := db.CompleteFlakeJob(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.CompleteFlakeJob(ctx, a); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("completing twice: %v", err)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationBuilding)
		got := pendingOf(t, db, ready)
		wantKeys(t, "flake completed", got, "base", "leaf")
		base := got[drvPath("base")]
		if base.Kind != storage.JobBuild || base.Architecture != "x86_64-linux" || !slices.Equal(base.RequiredFeatures, []string{"kvm"}) ||
			base.Outputs[0].Path != outPath("base") || base.EvaluationID != e.ID || base.ProjectID != e.ProjectID {
			t.Fatalf("build job %+v", base)
		}

		a = mustClaim(t, db, base.JobID, worker)
		if b := buildByDrv(t, db, e.ID, "base"); b.Status != storage.BuildBuilding || b.WorkerID != worker || b.Attempts != 1 || b.StartedAt.IsZero() {
			t.Fatalf("claimed build %+v", b)
		}
		ready, err = db.CompleteBuild(ctx, a, []storage.BuildOutputInfo{{Name: "out", StorePath: outPath("base"), NarSize: 7, NarHash: "sha256:b"}})
		if err != nil {
			t.Fatal(err)
		}
		after := pendingOf(t, db, ready)
		wantKeys(t, "base built", after, "lib", "tool")
		b := buildByDrv(t, db, e.ID, "base")
		if b.Status != storage.BuildSucceeded || len(b.OutputInfo) != 1 || b.OutputInfo[0].NarSize != 7 || b.FinishedAt.IsZero() {
			t.Fatalf("built %+v", b)
		}
		wantKeys(t, "leaf built", buildOK(t, db, got[drvPath("leaf")], worker))
		wantKeys(t, "tool built", buildOK(t, db, after[drvPath("tool")], worker))
		appReady := buildOK(t, db, after[drvPath("lib")], worker)
		wantKeys(t, "lib built", appReady, "app")
		if j := appReady[drvPath("app")]; j.TimeoutSecs == nil || *j.TimeoutSecs != 600 || j.MaxSilentSecs != nil || j.Attr != "packages.x86_64-linux.app" {
			t.Fatalf("app job %+v", j)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationBuilding)
		wantKeys(t, "app built", buildOK(t, db, appReady[drvPath("app")], worker))
		done := wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded)
		if done.FinishedAt.IsZero() || done.FlakeSource != "/nix/store/src" || done.Attempts != 1 {
			t.Fatalf("finished evaluation %+v", done)
		}
		if n := len(allPending(t, db)); n != 0 {
			t.Fatalf("%d pending jobs left", n)
		}
		if open, err := db.OpenAssignments(ctx); err != nil || len(open) != 0 {
			t.Fatalf("open assignments %+v, %v", open, err)
		}
		list, err := db.ListEvaluations(ctx, "", 10)
		if err != nil || len(list) != 1 || list[0].ID != e.ID {
			t.Fatalf("ListEvaluations = %+v, %v", list, err)
		}
	})
}

func TestEvaluationWithoutBuildsSucceeds(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		e := newEvaluation(t, db)
		if ready := startEvaluation(t, db, e.ID, storage.NewID()); len(ready) != 0 {
			t.Fatalf("ready %v", keys(ready))
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded)
		if _, err := db.LatestEvaluation(t.Context(), storage.NewID()); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("LatestEvaluation of a project without evaluations: %v", err)
		}
	})
}

func TestClaimRace(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		e := newEvaluation(t, db)
		job := flakeJob(t, db, e.ID)
		const racers = 8
		var wg sync.WaitGroup
		errs := make([]error, racers)
		for i := range racers {
			wg.Go(func() { _, errs[i] = db.ClaimJob(t.Context(), job.JobID, storage.NewID()) })
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, storage.ErrConflict):
				t.Fatalf("losing claim: %v", err)
			}
		}
		if wins != 1 {
			t.Fatalf("%d claims won, want 1", wins)
		}
		open, err := db.OpenAssignments(t.Context())
		if err != nil || len(open) != 1 {
			t.Fatalf("open assignments %+v, %v", open, err)
		}
		if _, err := db.ClaimJob(t.Context(), storage.NewID(), storage.NewID()); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("claim unknown job: %v", err)
		}
	})
}

func TestReleaseAssignmentRequeues(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		flake := flakeJob(t, db, e.ID)
		a := mustClaim(t, db, flake.JobID, storage.NewID())
		if err := db.ReleaseAssignment(ctx, a, OutcomeDeclined); err != nil {
			t.Fatal(err)
		}
		back := flakeJob(t, db, e.ID)
		if back.JobID != flake.JobID || !back.ReadyAt.Equal(flake.ReadyAt) || back.Attempts != 0 {
			t.Fatalf("released flake job %+v, was %+v", back, flake)
		}
		if ev := wantEvalStatus(t, db, e.ID, storage.EvaluationQueued); ev.Attempts != 0 {
			t.Fatalf("declined claim counted: %+v", ev)
		}
		if err := db.ReleaseAssignment(ctx, a, OutcomeDeclined); err != nil {
			t.Fatalf("release twice: %v", err)
		}
		if err := db.ReleaseAssignment(ctx, storage.NewID(), OutcomeDeclined); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("release unknown: %v", err)
		}
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "x"))
		job := ready[drvPath("a")]
		a = mustClaim(t, db, job.JobID, storage.NewID())
		if err := db.ReleaseAssignment(ctx, a, OutcomeDeclined); err != nil {
			t.Fatal(err)
		}
		if b := buildByDrv(t, db, e.ID, "a"); b.Status != storage.BuildQueued || b.Attempts != 0 {
			t.Fatalf("released build %+v", b)
		}
		if _, err := db.CompleteBuild(ctx, a, nil); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("complete released: %v", err)
		}
		wantKeys(t, "a built", buildOK(t, db, job, storage.NewID()))
		wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded)
	})
}

func TestTransientRetriedThenFailed(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "x"), discovered("b", "y", "a"))
		job := ready[drvPath("a")]
		const maxAttempts = 3
		for attempt := 1; attempt <= maxAttempts; attempt++ {
			a := mustClaim(t, db, job.JobID, storage.NewID())
			out, _, err := db.FailJob(ctx, a, storage.FailureTransient, "connection reset by peer", maxAttempts)
			if err != nil {
				t.Fatal(err)
			}
			if attempt < maxAttempts {
				if !out.Requeued || out.Failed || out.Attempts != attempt || out.BuildStatus != storage.BuildQueued {
					t.Fatalf("attempt %d: %+v", attempt, out)
				}
				if b := buildByDrv(t, db, e.ID, "a"); b.FailureKind != storage.FailureTransient || b.Error != "connection reset by peer" {
					t.Fatalf("requeued build %+v", b)
				}
				continue
			}
			if out.Requeued || !out.Failed || out.BuildStatus != storage.BuildFailed || out.EvaluationStatus != storage.EvaluationFailed {
				t.Fatalf("last attempt: %+v", out)
			}
			if _, _, err := db.FailJob(ctx, a, storage.FailureTransient, "again", maxAttempts); !errors.Is(err, storage.ErrConflict) {
				t.Fatalf("fail closed assignment: %v", err)
			}
		}
		if b := buildByDrv(t, db, e.ID, "b"); b.Status != storage.BuildDependencyFailed {
			t.Fatalf("dependent %+v", b)
		}
	})
}

func TestPermanentFailureCascades(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		// a ← b ← c ← d, c also needs e; f is independent.
		ready := startEvaluation(t, db, e.ID, storage.NewID(),
			discovered("d", "d", "c"), discovered("c", "", "b", "e"), discovered("b", "", "a"),
			discovered("a", ""), discovered("e", ""), discovered("f", "f"))
		wantKeys(t, "leaves", ready, "a", "e", "f")
		wantKeys(t, "e built", buildOK(t, db, ready[drvPath("e")], storage.NewID()))
		a := mustClaim(t, db, ready[drvPath("a")].JobID, storage.NewID())
		out, _, err := db.FailJob(ctx, a, storage.FailureTimeout, "timed out after 600 s", 3)
		if err != nil {
			t.Fatal(err)
		}
		if !out.Failed || out.BuildStatus != storage.BuildFailed || out.EvaluationStatus != storage.EvaluationBuilding {
			t.Fatalf("outcome %+v", out)
		}
		failed := buildByDrv(t, db, e.ID, "a")
		if failed.FailureKind != storage.FailureTimeout || failed.StatusText() != "timed out" || failed.Error != "timed out after 600 s" {
			t.Fatalf("failed build %+v (%s)", failed, failed.StatusText())
		}
		for _, n := range []string{"b", "c", "d"} {
			b := buildByDrv(t, db, e.ID, n)
			if b.Status != storage.BuildDependencyFailed || b.Error != "dependency failed: "+drvPath("a") || b.Attempts != 0 {
				t.Fatalf("dependent %s: %+v", n, b)
			}
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationBuilding) // f is still queued
		wantKeys(t, "f built", buildOK(t, db, ready[drvPath("f")], storage.NewID()))
		wantEvalStatus(t, db, e.ID, storage.EvaluationFailed)
		if n := len(allPending(t, db)); n != 0 {
			t.Fatalf("%d pending jobs left", n)
		}
	})
}

func TestFlakeJobFailureFailsEvaluation(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		a := mustClaim(t, db, flakeJob(t, db, e.ID).JobID, storage.NewID())
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{discovered("a", "x")}); err != nil {
			t.Fatal(err)
		}
		out, _, err := db.FailJob(ctx, a, storage.FailurePermanent, "error: attribute 'x' missing", 3)
		if err != nil {
			t.Fatal(err)
		}
		if !out.Failed || out.EvaluationStatus != storage.EvaluationFailed {
			t.Fatalf("outcome %+v", out)
		}
		ev := wantEvalStatus(t, db, e.ID, storage.EvaluationFailed)
		if ev.Error != "error: attribute 'x' missing" || ev.FinishedAt.IsZero() {
			t.Fatalf("failed evaluation %+v", ev)
		}
		if b := buildByDrv(t, db, e.ID, "a"); b.Status != storage.BuildCancelled {
			t.Fatalf("build of failed evaluation %+v", b)
		}
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{discovered("z", "")}); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("derivations after the evaluation failed: %v", err)
		}
	})
}

func TestAbortedAndCanceledNeverFail(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		flake := flakeJob(t, db, e.ID)
		for i := range 5 {
			a := mustClaim(t, db, flake.JobID, storage.NewID())
			kind := []storage.FailureKind{storage.FailureAborted, storage.FailureCanceled}[i%2]
			out, _, err := db.FailJob(ctx, a, kind, "stopped", 1)
			if err != nil {
				t.Fatal(err)
			}
			if !out.Requeued || out.Failed || out.Attempts != 0 || out.EvaluationStatus != storage.EvaluationQueued {
				t.Fatalf("%s flake job: %+v", kind, out)
			}
		}
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "x"))
		job := ready[drvPath("a")]
		for i := range 5 {
			a := mustClaim(t, db, job.JobID, storage.NewID())
			kind := []storage.FailureKind{storage.FailureAborted, storage.FailureCanceled}[i%2]
			out, _, err := db.FailJob(ctx, a, kind, "stopped", 1)
			if err != nil {
				t.Fatal(err)
			}
			if !out.Requeued || out.Failed || out.Attempts != 0 || out.BuildStatus != storage.BuildQueued {
				t.Fatalf("%s build job: %+v", kind, out)
			}
		}
		if b := buildByDrv(t, db, e.ID, "a"); b.Attempts != 0 || b.FailureKind != "" {
			t.Fatalf("build after aborts %+v", b)
		}
		// One real attempt remains with maxAttempts 1.
		a := mustClaim(t, db, job.JobID, storage.NewID())
		if out, _, err := db.FailJob(ctx, a, storage.FailureTransient, "oom", 1); err != nil || !out.Failed {
			t.Fatalf("transient with max 1: %+v, %v", out, err)
		}
		if _, _, err := db.FailJob(ctx, storage.NewID(), storage.FailureKind("Bogus"), "", 1); !errors.Is(err, storage.ErrInvalid) {
			t.Fatalf("unknown kind: %v", err)
		}
	})
}

func TestRecoverInterruptedWork(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		worker := storage.NewID()
		// One evaluation building (a running, b pending), one mid-evaluation,
		// one queued.
		building := newEvaluation(t, db)
		ready := startEvaluation(t, db, building.ID, worker, discovered("a", "a"), discovered("b", "b"))
		running := mustClaim(t, db, ready[drvPath("a")].JobID, worker)
		project := building.ProjectID
		evaluating, err := db.CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: project, RepositoryURL: "r", Commit: "c2"})
		if err != nil {
			t.Fatal(err)
		}
		mustClaim(t, db, flakeJob(t, db, evaluating.ID).JobID, worker)
		if err := db.SetEvaluationStatus(ctx, evaluating.ID, storage.EvaluationEvaluating); err != nil {
			t.Fatal(err)
		}
		queued, err := db.CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: project, RepositoryURL: "r", Commit: "c3"})
		if err != nil {
			t.Fatal(err)
		}
		if latest, err := db.LatestEvaluation(ctx, project); err != nil || latest.ID != queued.ID {
			t.Fatalf("LatestEvaluation = %+v, %v", latest, err)
		}
		before := len(allPending(t, db)) // b, queued's flake job

		for round, want := range []int{2, 0} {
			n, err := db.RecoverInterruptedWork(ctx)
			if err != nil || n != want {
				t.Fatalf("round %d: RecoverInterruptedWork = %d, %v; want %d", round, n, err, want)
			}
		}
		if got := len(allPending(t, db)); got != before+2 {
			t.Fatalf("%d pending jobs after recovery, want %d", got, before+2)
		}
		if b := buildByDrv(t, db, building.ID, "a"); b.Status != storage.BuildQueued || b.Attempts != 0 {
			t.Fatalf("interrupted build %+v", b)
		}
		wantEvalStatus(t, db, building.ID, storage.EvaluationBuilding)
		if ev := wantEvalStatus(t, db, evaluating.ID, storage.EvaluationQueued); ev.Attempts != 0 {
			t.Fatalf("interrupted evaluation %+v", ev)
		}
		flakeJob(t, db, evaluating.ID)
		flakeJob(t, db, queued.ID)
		if open, err := db.OpenAssignments(ctx); err != nil || len(open) != 0 {
			t.Fatalf("open assignments %+v, %v", open, err)
		}
		if _, err := db.CompleteBuild(ctx, running, nil); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("report on a pre-restart assignment: %v", err)
		}
	})
}

func TestCancelEvaluation(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		worker := storage.NewID()
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, worker, discovered("a", "a"), discovered("b", "b"), discovered("c", "c", "a"))
		running := mustClaim(t, db, ready[drvPath("a")].JobID, worker)
		open, err := db.CancelEvaluation(ctx, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(open) != 1 || open[0].AssignmentID != running || open[0].JobID != ready[drvPath("a")].JobID || open[0].WorkerID != worker {
			t.Fatalf("open assignments %+v", open)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationCancelled)
		for _, n := range []string{"a", "b", "c"} {
			if b := buildByDrv(t, db, e.ID, n); b.Status != storage.BuildCancelled {
				t.Fatalf("build %s %+v", n, b)
			}
		}
		if n := len(allPending(t, db)); n != 0 {
			t.Fatalf("%d pending jobs after cancel", n)
		}
		if _, _, err := db.FailJob(ctx, running, storage.FailureAborted, "aborted by server", 3); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("FailJob after cancel: %v", err)
		}
		if _, err := db.CompleteBuild(ctx, running, nil); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("CompleteBuild after cancel: %v", err)
		}
		if _, err := db.ClaimJob(ctx, ready[drvPath("b")].JobID, worker); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("claim cancelled job: %v", err)
		}
		if open, err := db.CancelEvaluation(ctx, e.ID); err != nil || len(open) != 0 {
			t.Fatalf("cancel twice: %+v, %v", open, err)
		}
		done := newEvaluationIn(t, db, e.ProjectID)
		startEvaluation(t, db, done.ID, worker)
		if _, err := db.CancelEvaluation(ctx, done.ID); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("cancel finished: %v", err)
		}
		if _, err := db.CancelEvaluation(ctx, storage.NewID()); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("cancel unknown: %v", err)
		}
	})
}

func newEvaluationIn(t *testing.T, db *testDB, projectID string) storage.Evaluation {
	t.Helper()
	e, err := db.CreateEvaluation(t.Context(), storage.NewEvaluation{ProjectID: projectID, RepositoryURL: "r", Commit: "c"})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestJobLogs(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		flake := flakeJob(t, db, e.ID)
		if err := db.AppendJobLog(ctx, flake.JobID, []byte("fetching\n")); err != nil {
			t.Fatal(err)
		}
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "a"))
		job := ready[drvPath("a")]
		if log, err := db.BuildLog(ctx, job.BuildID); err != nil || len(log) != 0 {
			t.Fatalf("empty BuildLog = %q, %v", log, err)
		}
		chunks := []string{"building\n", "\x00binary\xff\n", "done\n"}
		for _, c := range chunks {
			if err := db.AppendJobLog(ctx, job.JobID, []byte(c)); err != nil {
				t.Fatal(err)
			}
		}
		log, err := db.BuildLog(ctx, job.BuildID)
		if err != nil || string(log) != chunks[0]+chunks[1]+chunks[2] {
			t.Fatalf("BuildLog = %q, %v", log, err)
		}
		if log, err := db.EvaluationLog(ctx, e.ID); err != nil || string(log) != "fetching\n" {
			t.Fatalf("EvaluationLog = %q, %v", log, err)
		}
		if err := db.AppendJobLog(ctx, storage.NewID(), []byte("x")); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("append to unknown job: %v", err)
		}
		if _, err := db.BuildLog(ctx, storage.NewID()); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("log of unknown build: %v", err)
		}
	})
}

func TestAddDiscoveredDerivationsIdempotent(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		a := mustClaim(t, db, flakeJob(t, db, e.ID).JobID, storage.NewID())
		batch := []storage.DiscoveredBuild{discovered("lib", ""), discovered("app", "", "lib")}
		for range 2 {
			if err := db.AddDiscoveredDerivations(ctx, e.ID, batch); err != nil {
				t.Fatal(err)
			}
		}
		first := buildByDrv(t, db, e.ID, "app")
		// A repeat with an attr fills the empty one and changes nothing else.
		again := discovered("app", "packages.x86_64-linux.app", "lib")
		again.Architecture = "aarch64-linux"
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{again, discovered("lib", "")}); err != nil {
			t.Fatal(err)
		}
		// A later empty attr does not clear it.
		if err := db.AddDiscoveredDerivations(ctx, e.ID, batch); err != nil {
			t.Fatal(err)
		}
		builds, err := db.EvaluationBuilds(ctx, e.ID)
		if err != nil || len(builds) != 2 {
			t.Fatalf("EvaluationBuilds = %d, %v", len(builds), err)
		}
		app := buildByDrv(t, db, e.ID, "app")
		if app.ID != first.ID || app.Attr != "packages.x86_64-linux.app" || app.Architecture != "x86_64-linux" {
			t.Fatalf("app after repeats %+v", app)
		}
		if builds[0].ID != app.ID {
			t.Fatalf("entry points are not listed first: %+v", builds)
		}
		ready, err := db.CompleteFlakeJob(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		wantKeys(t, "flake completed", pendingOf(t, db, ready), "lib")
		if err := db.AddDiscoveredDerivations(ctx, e.ID, batch); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("derivations after the evaluation: %v", err)
		}
		if err := db.AddDiscoveredDerivations(ctx, storage.NewID(), batch); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("unknown evaluation: %v", err)
		}
	})
}

// TestConcurrentCompletionsReadyDependents completes the many inputs of
// one build at once: exactly one completion must ready it, and the
// evaluation must end once.
func TestConcurrentCompletionsReadyDependents(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		const inputs = 12
		e := newEvaluation(t, db)
		drvs := []storage.DiscoveredBuild{}
		var names []string
		for i := range inputs {
			n := string(rune('a' + i))
			names = append(names, n)
			drvs = append(drvs, discovered(n, ""))
		}
		drvs = append(drvs, discovered("top", "top", names...))
		ready := startEvaluation(t, db, e.ID, storage.NewID(), drvs...)
		if len(ready) != inputs {
			t.Fatalf("%d ready, want %d", len(ready), inputs)
		}
		var mu sync.Mutex
		var made []string
		var wg sync.WaitGroup
		for _, job := range ready {
			a := mustClaim(t, db, job.JobID, storage.NewID())
			wg.Go(func() {
				ids, err := db.CompleteBuild(t.Context(), a, nil)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				made = append(made, ids...)
				mu.Unlock()
			})
		}
		wg.Wait()
		if len(made) != 1 {
			t.Fatalf("top readied %d times", len(made))
		}
		wantKeys(t, "top built", buildOK(t, db, pendingOf(t, db, made)[drvPath("top")], storage.NewID()))
		wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded)
	})
}

// TestConcurrentLastBuildsFinishEvaluation completes every build of an
// evaluation at once: whichever commits last must end the evaluation.
func TestConcurrentLastBuildsFinishEvaluation(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		for round := range 3 {
			e := newEvaluationIn(t, db, newProjectID(t, db, round))
			var drvs []storage.DiscoveredBuild
			for i := range 6 {
				drvs = append(drvs, discovered(string(rune('a'+i)), "x"))
			}
			ready := startEvaluation(t, db, e.ID, storage.NewID(), drvs...)
			var wg sync.WaitGroup
			for _, job := range ready {
				a := mustClaim(t, db, job.JobID, storage.NewID())
				wg.Go(func() {
					if _, err := db.CompleteBuild(t.Context(), a, nil); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded)
		}
	})
}

func newProjectID(t *testing.T, db *testDB, n int) string {
	t.Helper()
	team := mustTeam(t, db, "team"+string(rune('a'+n)))
	return mustProject(t, db, team.ID, "p").ID
}

// TestConcurrentClaimsAndCompletions races three workers for every job
// and completes every assignment twice at once, as many sessions do
// together (on PostgreSQL the calls share batched statements): each job
// is claimed once, each build completed once, the dependent readied once,
// and the evaluation ends.
func TestConcurrentClaimsAndCompletions(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		var drvs []storage.DiscoveredBuild
		var names []string
		for i := range 40 {
			n := fmt.Sprintf("leaf%02d", i)
			names = append(names, n)
			drvs = append(drvs, discovered(n, ""))
		}
		drvs = append(drvs, discovered("top", "top", names...))
		ready := startEvaluation(t, db, e.ID, storage.NewID(), drvs...)
		if len(ready) != 40 {
			t.Fatalf("%d ready, want 40", len(ready))
		}
		type claim struct {
			job        string
			assignment string
			err        error
		}
		var mu sync.Mutex
		var claims []claim
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, job := range ready {
			for range 3 {
				wg.Go(func() {
					<-start
					a, err := db.ClaimJob(ctx, job.JobID, storage.NewID())
					mu.Lock()
					claims = append(claims, claim{job.JobID, a, err})
					mu.Unlock()
				})
			}
		}
		close(start)
		wg.Wait()
		won := map[string]string{}
		for _, c := range claims {
			switch {
			case c.err == nil:
				if won[c.job] != "" {
					t.Fatalf("job %s claimed twice", c.job)
				}
				won[c.job] = c.assignment
			case !errors.Is(c.err, storage.ErrConflict):
				t.Fatalf("losing claim of %s: %v", c.job, c.err)
			}
		}
		if len(won) != 40 {
			t.Fatalf("%d jobs claimed, want 40", len(won))
		}
		var completed, refused int
		var made []string
		start = make(chan struct{})
		for _, a := range won {
			for range 2 {
				wg.Go(func() {
					<-start
					ids, err := db.CompleteBuild(ctx, a, nil)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						completed++
						made = append(made, ids...)
					case errors.Is(err, storage.ErrConflict):
						refused++
					default:
						t.Errorf("completing %s: %v", a, err)
					}
				})
			}
		}
		close(start)
		wg.Wait()
		if completed != 40 || refused != 40 {
			t.Fatalf("%d completions took, %d refused; want 40 and 40", completed, refused)
		}
		if len(made) != 1 {
			t.Fatalf("top readied %d times", len(made))
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationBuilding)
		wantKeys(t, "top built", buildOK(t, db, pendingOf(t, db, made)[drvPath("top")], storage.NewID()))
		wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded)
	})
}

// An evaluation keeps the wildcards of when it was queued: changing the
// project's later does not change it.
func TestEvaluationKeepsItsWildcards(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		own := []string{"packages.*.*", "checks.x86_64-linux.*", "!checks.x86_64-linux.slow"}
		checked, err := db.CreateProject(ctx, storage.NewProject{TeamID: mustTeam(t, db, "a").ID, Name: "checked", Repository: "r", Branch: "main", Wildcards: own})
		if err != nil {
			t.Fatal(err)
		}
		queued, err := db.CreateEvaluation(ctx, checked.EvaluationAt("c0ffee"))
		if err != nil {
			t.Fatal(err)
		}
		if err := db.UpdateProjectWildcards(ctx, checked.ID, []string{"hydraJobs.*"}); err != nil {
			t.Fatal(err)
		}
		updated, err := db.Project(ctx, checked.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := db.Evaluation(ctx, queued.ID); err != nil || !slices.Equal(ev.Wildcards, own) {
			t.Fatalf("queued evaluation's wildcards %q, %v; want the ones it was queued with", ev.Wildcards, err)
		}
		if ev, err := db.CreateEvaluation(ctx, updated.EvaluationAt("c0ffee")); err != nil || !slices.Equal(ev.Wildcards, []string{"hydraJobs.*"}) {
			t.Fatalf("new evaluation's wildcards %q, %v", ev.Wildcards, err)
		}
	})
}

// The scheduler records completions beside its session loop only where
// they run side by side: on PostgreSQL, not behind SQLite's one writer.
func TestParallelCompletionsOnlyOnPostgres(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		if got, want := db.ParallelCompletions(), db.Engine() == storage.EnginePostgres; got != want {
			t.Fatalf("ParallelCompletions on %s = %v, want %v", db.Engine(), got, want)
		}
	})
}
