package scheduler_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// Two job loops on one PostgreSQL database, as two server instances run
// them (README "Several instances"). Their passes come once a minute, so
// only the notes between them explain what reaches the other at once.

// instanceEnv starts a job loop of instance id on its own pool of the
// database at dbURL, with e's project.
func (e *loopEnv) instance(dbURL, id string) *loopEnv {
	e.t.Helper()
	db := testworld.Open(e.t, dbURL)
	log, _ := testlog.New(e.t, "instance "+id)
	sched := scheduler.New(db, scheduler.Config{InstanceID: id, Tick: time.Minute, Logger: log})
	if err := sched.Start(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(sched.Close)
	e.t.Cleanup(func() {
		if err := sched.CheckJobStates(); err != nil {
			e.t.Error(err)
		}
	})
	waitListening(e.t, sched)
	return &loopEnv{t: e.t, db: db, sched: sched, project: e.project, cache: e.cache, secrets: e.secrets}
}

func waitListening(t *testing.T, s *scheduler.Scheduler) {
	t.Helper()
	select {
	case <-s.NotesListening():
	case <-time.After(30 * time.Second):
		t.Fatal("the job loop does not listen for notes after 30 s")
	}
	// Listening, it reads the queue once (what it missed before).
	waitfor.Within(t, 30*time.Second, "the reload after the first LISTEN", func() bool { return s.NoteReloads() >= 1 })
}

// twoInstances is instance A (with the project) and instance B.
func twoInstances(t *testing.T) (a, b *loopEnv) {
	url := storagetest.PostgresURL(t)
	base := newLoopEnv(t, url, scheduler.Config{}) // only for the project; no instance ID, no notes
	return base.instance(url, "inst-a"), base.instance(url, "inst-b")
}

// waitMessage waits for the next message of type T sent to w.
func waitMessage[T wire.ServerMessage](t *testing.T, w *testWorker, what string) T {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m := <-w.sent:
			if got, ok := m.(T); ok {
				return got
			}
		case <-deadline:
			var zero T
			t.Fatalf("no %s after 20 s (the other instance's pass is a minute away)", what)
			return zero
		}
	}
}

// A build readied on A reaches B's idle worker at once, and cancelling
// the evaluation on A aborts it on B's worker.
func TestNotesCarryReadyJobsAndAbortsAcrossInstances(t *testing.T) {
	a, b := twoInstances(t)
	builder := b.worker([]string{a.project}, allCaps, x86)
	builder.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if m := builder.assigned(); m != nil {
		t.Fatalf("assigned %s before any evaluation", m.JobID)
	}

	ev := a.evaluate(leaf("across"))
	assign := waitMessage[*wire.AssignJob](t, builder, "AssignJob on B for the build readied on A")
	if spec := assign.Job.(*wire.BuildJob).Builds[0]; spec.DrvPath != drv("across") {
		t.Fatalf("B's worker got %s", spec.DrvPath)
	}

	if err := a.sched.CancelEvaluation(t.Context(), ev.ID); err != nil {
		t.Fatal(err)
	}
	abort := waitMessage[*wire.AbortJob](t, builder, "AbortJob on B for the evaluation cancelled on A")
	if abort.JobID != assign.JobID || abort.Reason != "evaluation cancelled" {
		t.Fatalf("AbortJob %+v, want job %s", abort, assign.JobID)
	}
	// B forgot the assignment: the worker's late report is refused.
	builder.send(&wire.JobCompleted{JobID: assign.JobID, AssignmentID: assign.AssignmentID})
	got, err := jobqueue.New(a.db).Evaluation(t.Context(), ev.ID)
	if err != nil || got.Status != storage.EvaluationCancelled {
		t.Fatalf("evaluation %s, %v; want cancelled", got.Status, err)
	}
}

// An evaluation queued on A is handed to B's idle evaluator at once.
func TestNotedEvaluationReachesOtherInstance(t *testing.T) {
	a, b := twoInstances(t)
	evaluator := b.worker([]string{a.project}, wire.GradientCapabilities{Fetch: true, Eval: true}, nil)
	evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	if _, err := a.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: a.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"}); err != nil {
		t.Fatal(err)
	}
	assign := waitMessage[*wire.AssignJob](t, evaluator, "AssignJob on B for the evaluation queued on A")
	if _, ok := assign.Job.(*wire.FlakeJob); !ok {
		t.Fatalf("B's evaluator got a %T", assign.Job)
	}
}

// A job made pending while B does not listen (no note reaches it) is
// read by the full reload B does once it listens again after its LISTEN
// connection was terminated.
func TestLostListenConnectionReloads(t *testing.T) {
	url := storagetest.PostgresURL(t)
	base := newLoopEnv(t, url, scheduler.Config{})
	b := base.instance(url, "inst-b")
	evaluator := b.worker([]string{base.project}, wire.GradientCapabilities{Fetch: true, Eval: true}, nil)
	evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})

	// Queued behind every job loop's back: no note.
	if _, err := jobqueue.New(base.db).CreateEvaluation(t.Context(), storage.NewEvaluation{ProjectID: base.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-evaluator.sent:
		t.Fatalf("B sent %T before its LISTEN connection dropped", m)
	case <-time.After(300 * time.Millisecond):
	}
	terminateListeners(t, url)
	waitMessage[*wire.AssignJob](t, evaluator, "AssignJob after B listened again")
	// The first LISTEN's reload and the one after the lost connection.
	waitfor.True(t, "two reloads caused by notes", func() bool { return b.sched.NoteReloads() >= 2 })
}

// terminateListeners ends the connections listening on the jobs channel
// of the database at dbURL's schema, as a restarted PostgreSQL or a
// network cut would.
func terminateListeners(t *testing.T, dbURL string) {
	t.Helper()
	conn, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var schema string
	if err := conn.QueryRowContext(t.Context(), `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(schema))
	channel := "gradient_jobs_" + hex.EncodeToString(sum[:8])
	var pids []int
	waitfor.True(t, "a connection listening on "+channel, func() bool {
		rows, err := conn.QueryContext(t.Context(), `SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %' || $1 || '%'`, channel)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var pid int
			if err := rows.Scan(&pid); err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
		}
		return len(pids) > 0
	})
	for _, pid := range pids {
		if _, err := conn.ExecContext(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("terminated %d listening connection(s)", len(pids))
}
