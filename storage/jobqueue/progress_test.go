package jobqueue

import (
	"fmt"
	"path/filepath"
	"testing"

	"gradient.dev/gradient/storage"
)

// The mark of an evaluation's builds stays put while the evaluation only
// discovers (waiting) derivations, and moves when a build is queued,
// started or ended.
func TestEvaluationBuildsMark(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		mark := func() storage.BuildsMark {
			t.Helper()
			m, err := db.EvaluationBuildsMark(ctx, e.ID)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		empty := mark()
		worker := storage.NewID()
		a := mustClaim(t, db, flakeJob(t, db, e.ID).JobID, worker)
		if err := db.AddDiscoveredDerivations(ctx, e.ID, []storage.DiscoveredBuild{discovered("a", "packages.x86_64-linux.a"), discovered("b", "", "a")}); err != nil {
			t.Fatal(err)
		}
		if got := mark(); got != empty {
			t.Errorf("discovering waiting builds moved the mark: %+v", got)
		}
		ready, err := db.CompleteFlakeJob(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		queued := mark()
		if queued == empty {
			t.Fatal("queueing a build left the mark")
		}
		jobs := pendingOf(t, db, ready)
		job := jobs[drvPath("a")]
		claim := mustClaim(t, db, job.JobID, worker)
		building := mark()
		if building == queued {
			t.Fatal("starting a build left the mark")
		}
		if _, err := db.CompleteBuild(ctx, claim, []storage.BuildOutputInfo{{Name: "out", StorePath: job.Outputs[0].Path, NarSize: 42, NarHash: "sha256:x"}}); err != nil {
			t.Fatal(err)
		}
		if done := mark(); done == building || done == queued {
			t.Fatal("ending a build left the mark")
		}
		if again := mark(); again != mark() {
			t.Error("two marks without a change differ")
		}
	})
}

// What gradient up's poll reads during an evaluation that has discovered
// 20,000 derivations: every build, or their mark.
func BenchmarkEvaluationProgressPoll(b *testing.B) {
	db := openTestDB(b, "sqlite://"+filepath.Join(b.TempDir(), "gradient.db"))
	ctx := b.Context()
	e, _ := benchEvaluationClaimed(b, db)
	if err := db.SetEvaluationStatus(ctx, e.ID, storage.EvaluationEvaluating); err != nil {
		b.Fatal(err)
	}
	const n = 20000
	for start := 0; start < n; start += 1000 {
		var batch []storage.DiscoveredBuild
		for i := start; i < start+1000; i++ {
			batch = append(batch, storage.DiscoveredBuild{
				Attr: fmt.Sprintf("packages.x86_64-linux.p%d", i), DrvPath: fmt.Sprintf("/nix/store/%08d-p.drv", i),
				Outputs:      []storage.BuildOutputPath{{Name: "out", Path: fmt.Sprintf("/nix/store/%08d-p", i)}},
				Architecture: "x86_64-linux",
			})
		}
		if err := db.AddDiscoveredDerivations(ctx, e.ID, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("builds", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if bs, err := db.EvaluationBuilds(ctx, e.ID); err != nil || len(bs) != n {
				b.Fatal(len(bs), err)
			}
		}
	})
	b.Run("mark", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := db.EvaluationBuildsMark(ctx, e.ID); err != nil {
				b.Fatal(err)
			}
		}
	})
}
