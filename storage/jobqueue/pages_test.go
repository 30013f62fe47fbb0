package jobqueue

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/storage"
)

// Pages of builds: failed first, each build once, in the order the pages
// promise, with or without a status filter.
func TestBuildsPage(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		var drvs []storage.DiscoveredBuild
		for i := range 7 {
			drvs = append(drvs, discovered(string(rune('a'+i)), "p"+string(rune('a'+i))))
		}
		drvs = append(drvs, discovered("z", "pz", "a"))
		ready := startEvaluation(t, db, e.ID, storage.NewID(), drvs...)
		a := mustClaim(t, db, ready[drvPath("a")].JobID, storage.NewID())
		if _, _, err := db.FailJob(ctx, a, storage.FailurePermanent, "boom", 1); err != nil {
			t.Fatal(err)
		}
		buildOK(t, db, ready[drvPath("b")], storage.NewID())
		var all []storage.Build
		cur := BuildCursor{}
		for page := 0; ; page++ {
			builds, next, err := db.BuildsPage(ctx, e.ID, "", cur, 3)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, builds...)
			if next.IsZero() {
				break
			}
			cur = next
			if page > 10 {
				t.Fatal("pages never end")
			}
		}
		if len(all) != 8 {
			t.Fatalf("%d builds over the pages, want 8", len(all))
		}
		if all[0].Status != storage.BuildFailed || all[1].Status != storage.BuildDependencyFailed || all[len(all)-1].Status != storage.BuildSucceeded {
			t.Fatalf("order %v", statuses(all))
		}
		queued, next, err := db.BuildsPage(ctx, e.ID, storage.BuildQueued, BuildCursor{}, 100)
		if err != nil || !next.IsZero() || len(queued) != 5 {
			t.Fatalf("queued page: %d builds, next %+v, %v", len(queued), next, err)
		}
		if !slices.IsSortedFunc(queued, func(x, y storage.Build) int { return strings.Compare(x.ID, y.ID) }) {
			t.Fatal("a status group is not by ID")
		}
		counts, err := db.BuildStatusCounts(ctx, e.ID)
		if err != nil || counts[storage.BuildQueued] != 5 || counts[storage.BuildFailed] != 1 || counts[storage.BuildDependencyFailed] != 1 {
			t.Fatalf("counts %v, %v", counts, err)
		}
		o, err := db.ReadOverview(ctx, time.Now())
		if err != nil || o.EvaluationsRunning != 1 || o.FailedBuildsDay != 1 || o.BuildsLast10Min != 2 || len(o.RecentFailures) != 1 {
			t.Fatalf("overview %+v, %v", o, err)
		}
	})
}

// Restarting a failed evaluation's failed builds queues them again, lets
// their dependents wait for them, keeps what succeeded, and the
// evaluation ends succeeded once they do.
func TestRestartFailedBuilds(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "pa"), discovered("b", "pb", "a"), discovered("c", "pc"))
		if _, err := db.RestartFailedBuilds(ctx, e.ID); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("nothing failed yet: %v", err)
		}
		buildOK(t, db, ready[drvPath("c")], storage.NewID())
		a := mustClaim(t, db, ready[drvPath("a")].JobID, storage.NewID())
		if err := db.AppendJobLog(ctx, ready[drvPath("a")].JobID, []byte("first try\n")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.FailJob(ctx, a, storage.FailurePermanent, "boom", 1); err != nil {
			t.Fatal(err)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationFailed)

		jobs, err := db.RestartFailedBuilds(ctx, e.ID)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("restart: %v, %v", jobs, err)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationBuilding)
		if b := buildByDrv(t, db, e.ID, "b"); b.Status != storage.BuildWaiting || b.Error != "" {
			t.Fatalf("dependent after restart: %+v", b)
		}
		if c := buildByDrv(t, db, e.ID, "c"); c.Status != storage.BuildSucceeded {
			t.Fatalf("succeeded build after restart: %s", c.Status)
		}
		again := pendingOf(t, db, jobs)
		wantKeys(t, "restarted", again, "a")
		next := buildOK(t, db, again[drvPath("a")], storage.NewID())
		wantKeys(t, "dependent readied", next, "b")
		buildOK(t, db, next[drvPath("b")], storage.NewID())
		if got := wantEvalStatus(t, db, e.ID, storage.EvaluationSucceeded); got.Error != "" {
			t.Fatalf("evaluation error %q after the restart succeeded", got.Error)
		}
		log, err := db.BuildLog(ctx, buildByDrv(t, db, e.ID, "a").ID)
		if err != nil || string(log) != "first try\n" {
			t.Fatalf("log %q, %v: the first attempt's log is kept", log, err)
		}
		chunks, err := db.BuildLogChunks(ctx, buildByDrv(t, db, e.ID, "a").ID, 0, 10)
		if err != nil || len(chunks) != 1 || chunks[0].Seq != 1 {
			t.Fatalf("chunks %+v, %v", chunks, err)
		}
		if _, err := db.RestartFailedBuilds(ctx, e.ID); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("restart of a succeeded evaluation: %v", err)
		}
	})
}

func statuses(bs []storage.Build) []storage.BuildStatus {
	var out []storage.BuildStatus
	for _, b := range bs {
		out = append(out, b.Status)
	}
	return out
}
