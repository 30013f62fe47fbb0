package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// An evaluation's ready builds join the queue in chunks (issue 21): a
// worker waiting for work gets a build of the first chunk while later
// builds of the evaluation are still waiting in the database, and the
// builds then go out oldest ready first, in the database's order.
func TestReadyBuildsStreamInChunks(t *testing.T) {
	for _, engine := range testEngines {
		t.Run(engine.name, func(t *testing.T) {
			e := newLoopEnv(t, engine.url(t), scheduler.Config{})
			n := 2*jobqueue.ReadyChunk + 300
			var leaves []wire.DiscoveredDerivation
			for i := range n {
				leaves = append(leaves, leaf(fmt.Sprintf("stream%05d", i)))
			}
			w := e.worker([]string{e.project}, allCaps, x86)
			w.send(&wire.RequestJob{Kind: wire.JobKindBuild}) // idle before the evaluation ends
			var chunks [][]string
			var first *wire.AssignJob
			var waitingThen int
			e.sched.OnAdmitted(func(ids []string) {
				chunks = append(chunks, ids)
				if len(chunks) != 1 {
					return
				}
				first = w.assigned()
				waitingThen = countBuilds(t, e.db, storage.BuildWaiting)
			})
			e.evaluate(leaves...)
			if first == nil {
				t.Fatal("no build assigned while the first chunk was queued")
			}
			if !slices.Contains(chunks[0], first.JobID) {
				t.Errorf("first assignment %s is not of the first chunk", first.JobID)
			}
			if waitingThen == 0 {
				t.Error("every build was queued before the first assignment: no chunks")
			}
			if len(chunks) < 3 || len(chunks[0]) > jobqueue.ReadyChunk {
				t.Errorf("chunks of %v jobs, want at least 3 of at most %d", lens(chunks), jobqueue.ReadyChunk)
			}
			total := 0
			for _, c := range chunks {
				total += len(c)
			}
			if total != n {
				t.Fatalf("%d jobs admitted, want %d", total, n)
			}
			// The rest go out in the database's order: oldest ready first.
			pending, err := jobqueue.New(e.db).PendingJobs(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(pending) != n-1 {
				t.Fatalf("%d pending jobs, want %d", len(pending), n-1)
			}
			w.send(&wire.JobCompleted{JobID: first.JobID, AssignmentID: first.AssignmentID})
			for i, want := range pending[:1200] {
				w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
				a := w.mustAssigned(fmt.Sprintf("build %d", i))
				if a.JobID != want.JobID {
					t.Fatalf("assignment %d is %s (ready %v), want %s (ready %v)", i, a.JobID, jobReady(pending, a.JobID), want.JobID, want.ReadyAt)
				}
				w.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
			}
		})
	}
}

var testEngines = []struct {
	name string
	url  func(testing.TB) string
}{
	{"sqlite", storagetest.SQLiteURL},
	{"postgres", storagetest.PostgresURL},
}

func lens(chunks [][]string) []int {
	var out []int
	for _, c := range chunks {
		out = append(out, len(c))
	}
	return out
}

func jobReady(jobs []storage.PendingJob, id string) time.Time {
	for _, j := range jobs {
		if j.JobID == id {
			return j.ReadyAt
		}
	}
	return time.Time{}
}

// countBuilds counts the builds of every evaluation in a status.
func countBuilds(t *testing.T, db *storage.DB, status storage.BuildStatus) int {
	t.Helper()
	queue := jobqueue.New(db)
	evs, err := queue.ListEvaluations(t.Context(), "", 100)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		builds, err := queue.EvaluationBuilds(t.Context(), ev.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range builds {
			if b.Status == status {
				n++
			}
		}
	}
	return n
}

// The last completion of an evaluation ends it, though completions no
// longer ask the database whether they were the last: the scheduler
// knows from its queue.
func TestLastCompletionEndsTheEvaluation(t *testing.T) {
	for _, engine := range testEngines {
		t.Run(engine.name, func(t *testing.T) {
			e := newLoopEnv(t, engine.url(t), scheduler.Config{})
			a, b := leaf("end-a"), leaf("end-b")
			ev := e.evaluate(a, b)
			w1 := e.worker([]string{e.project}, allCaps, x86)
			w2 := e.worker([]string{e.project}, allCaps, x86)
			w1.send(&wire.RequestJob{Kind: wire.JobKindBuild})
			w2.send(&wire.RequestJob{Kind: wire.JobKindBuild})
			j1, j2 := w1.mustAssigned("first build"), w2.mustAssigned("second build")
			w1.send(&wire.JobCompleted{JobID: j1.JobID, AssignmentID: j1.AssignmentID})
			if got := evaluationStatus(t, e.db, ev.ID); got != storage.EvaluationBuilding {
				t.Fatalf("after one of two builds the evaluation is %s, want building", got)
			}
			w2.send(&wire.JobCompleted{JobID: j2.JobID, AssignmentID: j2.AssignmentID})
			if got := evaluationStatus(t, e.db, ev.ID); got != storage.EvaluationSucceeded {
				t.Fatalf("after the last build the evaluation is %s, want succeeded (no pass ran)", got)
			}
		})
	}
}

func evaluationStatus(t *testing.T, db *storage.DB, id string) storage.EvaluationStatus {
	t.Helper()
	ev, err := jobqueue.New(db).Evaluation(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return ev.Status
}

// The periodic pass reads the queue's IDs again: a job made pending
// behind the scheduler's back is picked up, one it still holds that the
// database no longer has pending is dropped.
func TestPassResyncsTheQueue(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{Tick: 20 * time.Millisecond})
	w := e.worker([]string{e.project}, allCaps, x86)
	w.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	_, err := jobqueue.New(e.db).CreateEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	var a *wire.AssignJob
	waitfor.True(t, "the flake job of an evaluation created behind the scheduler's back", func() bool {
		a = w.assigned()
		return a != nil
	})
	if job := a.Job.(*wire.FlakeJob); job == nil {
		t.Fatalf("assigned %T", a.Job)
	}
	// Cancelled behind its back, the next evaluation's job leaves the queue.
	ev2, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "def"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobqueue.New(e.db).CancelEvaluation(context.Background(), ev2.ID); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, "the cancelled job dropped from the queue", func() bool {
		return e.sched.QueueLen() == 0
	})
}

// An EvalResult's ready builds are assignable before the evaluation ends,
// unless Config.HoldStreamedBuilds holds them until the flake job
// completes (evaluation, then build).
func TestHoldStreamedBuilds(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{HoldStreamedBuilds: hold})
			ev, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"})
			if err != nil {
				t.Fatal(err)
			}
			builder := e.worker([]string{e.project}, allCaps, x86)
			builder.send(&wire.RequestJob{Kind: wire.JobKindBuild}) // idle before the evaluation reports
			evaluator := e.worker([]string{e.project}, wire.GradientCapabilities{Fetch: true, Eval: true}, nil)
			evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})
			fj := evaluator.mustAssigned("flake job")
			evaluator.send(&wire.JobUpdate{JobID: fj.JobID, AssignmentID: fj.AssignmentID, Update: &wire.JobUpdateEvalResult{
				Derivations: []wire.DiscoveredDerivation{leaf("held-a"), leaf("held-b")}, Warnings: []string{}, Errors: []string{}}})
			early := builder.assigned()
			if !hold && early == nil {
				t.Fatal("no build assigned while evaluating; want it streamed")
			}
			if hold {
				if early != nil {
					t.Fatalf("build %s assigned while evaluating; want it held until the evaluation's end", early.JobID)
				}
				if got := countBuilds(t, e.db, storage.BuildWaiting); got != 2 {
					t.Fatalf("%d builds waiting while evaluating, want 2", got)
				}
			}
			evaluator.send(&wire.JobCompleted{JobID: fj.JobID, AssignmentID: fj.AssignmentID})
			if hold {
				builder.mustAssigned("a build after the evaluation's end")
			}
			if got := evaluationStatus(t, e.db, ev.ID); got != storage.EvaluationBuilding {
				t.Fatalf("evaluation %s after its flake job, want building", got)
			}
		})
	}
}
