package jobqueue

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/storage"
)

// A build's offer names the outputs of its direct input derivations, with
// their sizes when the project's cache holds them (docs/protocol/jobs.md §3.1).
func TestPendingJobsRequiredPaths(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		const (
			knownOut = "/nix/store/0000000000000000000000000000kn0w-known"
			libOut   = "/nix/store/1111111111111111111111111111lib0-lib"
			libDev   = "/nix/store/2222222222222222222222222222lib1-lib-dev"
			baseOut  = "/nix/store/3333333333333333333333333333bas3-base"
		)
		drv := func(name, out string, deps ...string) storage.DiscoveredBuild {
			d := storage.DiscoveredBuild{DrvPath: drvPath(name), Outputs: []storage.BuildOutputPath{{Name: "out", Path: out}},
				Architecture: "x86_64-linux", Dependencies: []string{}}
			for _, dep := range deps {
				d.Dependencies = append(d.Dependencies, drvPath(dep))
			}
			return d
		}
		team := mustTeam(t, db, "t")
		project := mustProject(t, db, team.ID, "p")
		other := mustProject(t, db, team.ID, "other")
		cache, otherCache := mustCache(t, db, "main"), mustCache(t, db, "elsewhere")
		for _, sub := range []struct{ project, cache string }{{project.ID, cache.ID}, {other.ID, otherCache.ID}} {
			if _, err := db.SubscribeProject(ctx, sub.project, sub.cache); err != nil {
				t.Fatal(err)
			}
		}
		put := func(cacheID, path string, fileSize, narSize int64) {
			t.Helper()
			p := storage.CachePath{CacheID: cacheID, StorePath: path, NarHash: "sha256:0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73",
				NarSize: narSize, FileHash: "sha256:094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic", FileSize: fileSize,
				Compression: "zstd", ObjectKey: "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic"}
			if _, _, err := db.PutCachePath(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		worker := storage.NewID()

		// Two earlier evaluations built "known" (two rows name its
		// output); only another project's cache holds it.
		for range 2 {
			earlier := newEvaluationIn(t, db, project.ID)
			for _, j := range startEvaluation(t, db, earlier.ID, worker, drv("known", knownOut)) {
				buildOK(t, db, j, worker)
			}
		}
		put(otherCache.ID, knownOut, 5, 6)

		// app needs lib (two outputs, one cached) and base of its own
		// evaluation, and "known", which this evaluation did not report.
		lib := drv("lib", libOut)
		lib.Outputs = append(lib.Outputs, storage.BuildOutputPath{Name: "dev", Path: libDev})
		ev := newEvaluationIn(t, db, project.ID)
		ready := startEvaluation(t, db, ev.ID, worker, drv("app", "/nix/store/4444444444444444444444444444app0-app", "lib", "base", "known"),
			lib, drv("base", baseOut))
		wantKeys(t, "first ready", ready, "lib", "base")
		if got := ready[drvPath("lib")].RequiredPaths; len(got) != 0 {
			t.Fatalf("lib has no inputs, required paths %+v", got)
		}
		put(cache.ID, libOut, 80, 120)
		buildOK(t, db, ready[drvPath("base")], worker)
		a := mustClaim(t, db, ready[drvPath("lib")].JobID, worker)
		ids, err := db.CompleteBuild(ctx, a, []storage.BuildOutputInfo{{Name: "out", StorePath: libOut}, {Name: "dev", StorePath: libDev}})
		if err != nil {
			t.Fatal(err)
		}
		want := []storage.RequiredPath{
			{Path: knownOut},
			{Path: libOut, Cached: true, FileSize: 80, NarSize: 120},
			{Path: libDev},
			{Path: baseOut},
		}
		slices.SortFunc(want, func(a, b storage.RequiredPath) int { return strings.Compare(a.Path, b.Path) })
		app := pendingOf(t, db, ids)[drvPath("app")]
		if app.RequiredPaths != nil {
			t.Fatalf("PendingJobsByID read required paths %+v: only FillRequiredPaths does", app.RequiredPaths)
		}
		jobs := allPending(t, db)
		jobs = append(jobs, app, app) // the same job twice is filled twice
		if err := db.FillRequiredPaths(ctx, jobs); err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			switch {
			case j.JobID == app.JobID && !slices.Equal(j.RequiredPaths, want):
				t.Fatalf("app requires %+v\nwant %+v", j.RequiredPaths, want)
			case j.JobID != app.JobID && len(j.RequiredPaths) != 0:
				t.Fatalf("%s %s requires %+v, want nothing", j.Kind, j.DrvPath, j.RequiredPaths)
			}
		}
		// Filling again gives the same, not twice as many.
		if err := db.FillRequiredPaths(ctx, jobs); err != nil || !slices.Equal(jobs[len(jobs)-1].RequiredPaths, want) {
			t.Fatalf("filled again: %+v, %v", jobs[len(jobs)-1].RequiredPaths, err)
		}
	})
}

// A fetch-only assignment ends with the flake job pending again, the
// attempt not counted; its next claim is the evaluation.
func TestCompleteFetch(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		worker := storage.NewID()
		// A worker lost while fetching: with a limit of two lost workers
		// in a row, one more would fail the job, unless the fetch that
		// completes starts the count over.
		lost := mustClaim(t, db, flakeJob(t, db, e.ID).JobID, worker)
		if failed, err := db.ReleaseLostAssignment(ctx, lost, 2); err != nil || failed {
			t.Fatalf("first lost worker: failed %v, %v", failed, err)
		}
		a := mustClaim(t, db, flakeJob(t, db, e.ID).JobID, worker)
		if err := db.CompleteFetch(ctx, a); !errors.Is(err, storage.ErrInvalid) {
			t.Fatalf("CompleteFetch without a recorded source: %v, want ErrInvalid", err)
		}
		if open, err := db.OpenAssignments(ctx); err != nil || len(open) != 1 || open[0].AssignmentID != a {
			t.Fatalf("after the refused CompleteFetch: open assignments %+v, %v; want it still open", open, err)
		}
		const source = "/nix/store/00000000000000000000000000000src-source"
		if err := db.SetFlakeSource(ctx, e.ID, source); err != nil {
			t.Fatal(err)
		}
		if err := db.CompleteFetch(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := db.CompleteFetch(ctx, a); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("CompleteFetch twice: %v, want ErrConflict", err)
		}
		job := flakeJob(t, db, e.ID)
		if job.FlakeSource != source || job.Attempts != 0 {
			t.Fatalf("job after the fetch: source %q, attempts %d", job.FlakeSource, job.Attempts)
		}
		ev := wantEvalStatus(t, db, e.ID, storage.EvaluationQueued)
		if ev.Attempts != 0 {
			t.Fatalf("evaluation attempts %d after a fetch, want 0", ev.Attempts)
		}
		evaluating := mustClaim(t, db, job.JobID, worker)
		if ev := wantEvalStatus(t, db, e.ID, storage.EvaluationEvaluating); ev.Attempts != 1 {
			t.Fatalf("evaluation attempts %d, want 1", ev.Attempts)
		}
		if failed, err := db.ReleaseLostAssignment(ctx, evaluating, 2); err != nil || failed {
			t.Fatalf("a lost evaluator after a completed fetch: failed %v, %v; want the count started over", failed, err)
		}
	})
}
