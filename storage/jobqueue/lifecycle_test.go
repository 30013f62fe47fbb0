package jobqueue

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/storage"
)

// An evaluation that reported errors still builds what it found, then
// ends failed with them, even when every build succeeded.
func TestEvaluationErrorsFailTheEvaluation(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		a := mustClaim(t, db, flakeJob(t, db, e.ID).JobID, storage.NewID())
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{discovered("ok", "packages.x.ok")}); err != nil {
			t.Fatal(err)
		}
		for _, msg := range []string{"nix-eval:packages.x.bad: boom", "target 'y' matched no derivations in the flake"} {
			if err := db.AddEvaluationErrors(ctx, e.ID, []string{msg}); err != nil {
				t.Fatal(err)
			}
		}
		ready, err := db.CompleteFlakeJob(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		for _, job := range pendingOf(t, db, ready) {
			buildOK(t, db, job, storage.NewID())
		}
		got, err := db.Evaluation(ctx, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != storage.EvaluationFailed || !strings.Contains(got.Error, "boom") || !strings.Contains(got.Error, "matched no derivations") {
			t.Fatalf("evaluation %s with error %q; want failed naming both errors", got.Status, got.Error)
		}
	})
}

// BuiltDerivations names the derivations some evaluation built, with
// their outputs, and nothing else.
func TestBuiltDerivations(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "packages.x.a"), discovered("b", "packages.x.b", drvPath("a")))
		buildOK(t, db, ready[drvPath("a")], storage.NewID())
		built, err := db.BuiltDerivations(t.Context(), []string{drvPath("a"), drvPath("b"), drvPath("zzz")})
		if err != nil {
			t.Fatal(err)
		}
		if len(built) != 1 || !slices.Equal(built[drvPath("a")], []string{outPath("a")}) {
			t.Fatalf("built %v, want only a with its output", built)
		}
	})
}

// The sweep ends an evaluation left building although every build ended
// (a crash between the last completion's commit and the evaluation's
// end), and leaves running ones alone.
func TestFinishDoneEvaluations(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "packages.x.a"))
		buildOK(t, db, ready[drvPath("a")], storage.NewID())
		// As if the process died before ending the evaluation.
		if _, err := db.sql.ExecContext(ctx, `UPDATE evaluations SET status = 'building', finished_at = NULL WHERE id = $1`, e.ID); err != nil {
			t.Fatal(err)
		}
		running := newEvaluationIn(t, db, e.ProjectID)
		startEvaluation(t, db, running.ID, storage.NewID(), discovered("b", "packages.x.b"))

		n, err := db.FinishDoneEvaluations(ctx)
		if err != nil || n != 1 {
			t.Fatalf("FinishDoneEvaluations = %d, %v; want 1", n, err)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded)
		wantEvalStatus(t, db, running.ID, storage.EvaluationBuilding)
	})
}

// A build left waiting although its inputs are built (a crash between a
// completion and the readying of its dependents) is queued by the sweep.
func TestReadyStrandedBuilds(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "packages.x.a"), discovered("b", "packages.x.b", "a"))
		next := buildOK(t, db, ready[drvPath("a")], storage.NewID())
		// As if the process died before b was readied.
		if _, err := db.sql.ExecContext(ctx, `DELETE FROM jobs WHERE id = $1`, next[drvPath("b")].JobID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.sql.ExecContext(ctx, `UPDATE builds SET status = 'waiting' WHERE evaluation_id = $1 AND drv_path = $2`, e.ID, drvPath("b")); err != nil {
			t.Fatal(err)
		}
		jobs, err := db.ReadyStrandedBuilds(ctx)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("ReadyStrandedBuilds = %v, %v; want b's new job", jobs, err)
		}
		if p := pendingOf(t, db, jobs); p[drvPath("b")].JobID == "" {
			t.Fatalf("pending %v, want b", p)
		}
		if again, err := db.ReadyStrandedBuilds(ctx); err != nil || len(again) != 0 {
			t.Fatalf("second sweep = %v, %v; want nothing", again, err)
		}
	})
}

// Import from derivation: asked-for builds and their dependencies are
// built while the evaluation still runs; other builds wait for its end.
func TestRequestImports(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		flake := mustClaim(t, db, flakeJob(t, db, e.ID).JobID, storage.NewID())
		// gen ← ifd (imported); lib ← app (an ordinary root).
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{
			discovered("gen", ""), discovered("ifd", "other.x.ifd", "gen"),
			discovered("lib", ""), discovered("app", "packages.x.app", "lib"),
		}); err != nil {
			t.Fatal(err)
		}
		ready, unknown, err := db.RequestImports(ctx, e.ID, []string{drvPath("ifd"), drvPath("nowhere")})
		if err != nil {
			t.Fatal(err)
		}
		if len(unknown) != 1 || unknown[0] != drvPath("nowhere") {
			t.Errorf("unknown %v, want the drv the evaluation never reported", unknown)
		}
		jobs := pendingOf(t, db, ready)
		if len(jobs) != 1 || jobs[drvPath("gen")].JobID == "" {
			t.Fatalf("ready %v, want only gen (ifd's input) while evaluating", keys(jobs))
		}
		next := buildOK(t, db, jobs[drvPath("gen")], storage.NewID())
		if len(next) != 1 || next[drvPath("ifd")].JobID == "" {
			t.Fatalf("after gen: %v, want ifd", keys(next))
		}
		buildOK(t, db, next[drvPath("ifd")], storage.NewID())
		imported, err := db.ImportBuilds(ctx, e.ID, []string{drvPath("ifd")})
		if err != nil || imported[drvPath("ifd")].Status != storage.BuildSucceeded {
			t.Fatalf("import builds %v, %v", imported, err)
		}
		// The ordinary builds waited: lib is queued only now.
		rest, err := db.CompleteFlakeJob(ctx, flake)
		if err != nil {
			t.Fatal(err)
		}
		if got := pendingOf(t, db, rest); len(got) != 1 || got[drvPath("lib")].JobID == "" {
			t.Fatalf("at the evaluation's end: %v, want lib", keys(got))
		}
	})
}

// A cached build succeeds without a run: its pending job ends, and its
// dependents become runnable.
func TestMarkBuildsCached(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "packages.x.a"), discovered("b", "packages.x.b", "a"),
			discovered("c", "packages.x.c"))
		a, c := ready[drvPath("a")], ready[drvPath("c")]
		cache := mustCache(t, db, "main")
		if _, err := db.SubscribeProject(ctx, e.ProjectID, cache.ID); err != nil {
			t.Fatal(err)
		}
		// a's output has a row in the project's cache; c's row is gone
		// (collected since the scheduler looked).
		const aOut = "/nix/store/0000000000000000000000000000aaaa-a"
		const cOut = "/nix/store/0000000000000000000000000000cccc-c"
		if _, _, err := db.PutCachePath(ctx, storage.CachePath{CacheID: cache.ID, StorePath: aOut, NarHash: "sha256:0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73",
			NarSize: 1, FileHash: "sha256:094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic", FileSize: 1,
			Compression: "zstd", ObjectKey: "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic"}); err != nil {
			t.Fatal(err)
		}
		outputs := map[string][]storage.BuildOutputInfo{a.BuildID: {{Name: "out", StorePath: aOut, NarSize: 1}},
			c.BuildID: {{Name: "out", StorePath: cOut, NarSize: 1}}}
		next, err := db.MarkBuildsCached(ctx, e.ID, outputs)
		if err != nil {
			t.Fatal(err)
		}
		if p := pendingOf(t, db, next); len(p) != 1 || p[drvPath("b")].JobID == "" {
			t.Fatalf("made ready %v, want b", keys(p))
		}
		if _, ok := outputs[c.BuildID]; ok || len(outputs) != 1 {
			t.Fatalf("outputs after marking: %v; want only a (c's row is gone: c must be built)", outputs)
		}
		if got := buildByDrv(t, db, e.ID, "c"); got.Status == storage.BuildSucceeded {
			t.Fatal("c was marked cached although its output has no row")
		}
		if got := buildByDrv(t, db, e.ID, "a"); got.Status != storage.BuildSucceeded {
			t.Fatalf("a is %s, want succeeded", got.Status)
		}
		for _, j := range allPending(t, db) {
			if j.JobID == a.JobID {
				t.Fatal("the cached build's job is still pending")
			}
		}
		if _, err := db.ClaimJob(ctx, a.JobID, storage.NewID()); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("claiming the cached build's job: %v, want a conflict", err)
		}
	})
}

// The sweep runs on every scheduler pass: among thousands of finished
// evaluations it reads the building ones through evaluations_building,
// not every evaluation ever recorded (issue 21).
func TestFinishDoneEvaluationsReadsOnlyBuildingOnes(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		if _, err := db.sql.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
			INSERT INTO evaluations (id, project_id, repository_url, commit_sha, wildcards, status, created_at, finished_at)
			SELECT 'done' || i, $1, 'https://example.invalid/p.git', 'abc', '[]', 'succeeded', i, i FROM n`, e.ProjectID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.sql.ExecContext(ctx, `ANALYZE`); err != nil {
			t.Fatal(err)
		}
		explain := `EXPLAIN `
		if db.Engine() == storage.EngineSQLite {
			explain = `EXPLAIN QUERY PLAN `
		}
		rows, err := db.sql.QueryContext(ctx, explain+doneEvaluationsSQL)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		var plan []string
		for rows.Next() {
			vals := make([]any, len(cols))
			for i := range vals {
				vals[i] = new(any)
			}
			if err := rows.Scan(vals...); err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				plan = append(plan, fmt.Sprint(*v.(*any)))
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if text := strings.Join(plan, " "); !strings.Contains(text, "evaluations_building") {
			t.Errorf("the sweep's plan does not use evaluations_building:\n%s", text)
		}
	})
}
