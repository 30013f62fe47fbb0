package scheduler_test

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/authority/authoritytest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/deploykeys"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// Unit tests of the job loop with protocol-level test workers (no
// sockets, no Nix) over a real database.

type loopEnv struct {
	t       *testing.T
	db      *storage.DB
	sched   *scheduler.Scheduler
	project string
	cache   string
	secrets *sealbox.Box // the server key sealing deploy keys
}

func newLoopEnv(t *testing.T, dbURL string, cfg scheduler.Config) *loopEnv {
	t.Helper()
	db := testworld.Open(t, dbURL)
	project, cache := testworld.Project(t, db, "https://example.invalid/p.git")
	if cfg.Tick == 0 {
		cfg.Tick = time.Hour // passes only when a test asks
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	secrets, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DeployKeys = deploykeys.New(db, secrets)
	sched := scheduler.New(db, cfg)
	if err := sched.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Close)
	t.Cleanup(func() { // before Close: the jobs' states as the test left them
		if err := sched.CheckJobStates(); err != nil {
			t.Error(err)
		}
	})
	return &loopEnv{t: t, db: db, sched: sched, project: project.ID, cache: cache.ID, secrets: secrets}
}

// testWorker is a session as the job loop sees it, with what it was sent.
type testWorker struct {
	env  *loopEnv
	live *authority.LiveWorker
	sent chan wire.ServerMessage
}

var (
	allCaps = wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}
	x86     = &wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, SystemFeatures: []string{}}
)

var everything = authority.Abilities{Fetch: true, Eval: true, Build: true}

func (e *loopEnv) worker(projects []string, caps wire.GradientCapabilities, host *wire.WorkerCapabilities) *testWorker {
	allowed := map[string]authority.Abilities{}
	for _, p := range projects {
		allowed[p] = everything
	}
	return e.workerWith(allowed, caps, host)
}

// workerWith is a worker whose projects allow only some abilities.
func (e *loopEnv) workerWith(projects map[string]authority.Abilities, caps wire.GradientCapabilities, host *wire.WorkerCapabilities) *testWorker {
	w := &testWorker{env: e, sent: make(chan wire.ServerMessage, 4096)}
	w.live = authoritytest.NewLiveWorker(storage.NewID(), projects, caps, host, func(m wire.ServerMessage) error {
		w.sent <- m
		return nil
	})
	e.sched.SessionStarted(w.live)
	return w
}

// send hands the scheduler a report and waits until it is recorded, as
// a worker that waits for the server's next message would.
func (w *testWorker) send(m wire.ClientMessage) {
	w.env.sched.HandleJobMessage(w.live, m)
	w.env.sched.WaitRecorded()
}

// assigned is the next AssignJob sent to w, or nil if none is waiting.
func (w *testWorker) assigned() *wire.AssignJob {
	for {
		select {
		case m := <-w.sent:
			if a, ok := m.(*wire.AssignJob); ok {
				return a
			}
		default:
			return nil
		}
	}
}

func (w *testWorker) mustAssigned(what string) *wire.AssignJob {
	w.env.t.Helper()
	a := w.assigned()
	if a == nil {
		w.env.t.Fatalf("%s: no AssignJob", what)
	}
	return a
}

func drv(name string) string {
	return "/nix/store/" + fmt.Sprintf("%032d", len(name)) + "-" + name + ".drv"
}

// evaluate runs an evaluation's flake job on a fetch/eval test worker
// that reports derivations, so that their builds become runnable.
func (e *loopEnv) evaluate(derivations ...wire.DiscoveredDerivation) storage.Evaluation {
	e.t.Helper()
	ev, err := e.sched.StartEvaluation(e.t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"})
	if err != nil {
		e.t.Fatal(err)
	}
	evaluator := e.worker([]string{e.project}, wire.GradientCapabilities{Fetch: true, Eval: true}, nil)
	evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	a := evaluator.mustAssigned("flake job")
	evaluator.send(&wire.JobUpdate{JobID: a.JobID, AssignmentID: a.AssignmentID, Update: &wire.JobUpdateEvalResult{Derivations: derivations, Warnings: []string{}, Errors: []string{}}})
	evaluator.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	e.sched.SessionEnded(evaluator.live, "done")
	return ev
}

func leaf(name string) wire.DiscoveredDerivation {
	return wire.DiscoveredDerivation{Attr: "packages.x86_64-linux." + name, DrvPath: drv(name), Architecture: "x86_64-linux",
		Outputs:      []wire.DerivationOutput{{Name: "out", Path: "/nix/store/" + fmt.Sprintf("%032d", len(name)+1) + "-" + name}},
		Dependencies: []string{}, InputSources: []string{}, RequiredFeatures: []string{}}
}

func (e *loopEnv) build(evalID string) storage.Build {
	e.t.Helper()
	builds, err := jobqueue.New(e.db).EvaluationBuilds(e.t.Context(), evalID)
	if err != nil || len(builds) != 1 {
		e.t.Fatalf("builds %+v, %v", builds, err)
	}
	return builds[0]
}

func TestDispatchEligibility(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	kvm := leaf("kvm-test")
	kvm.RequiredFeatures = []string{"kvm"}
	e.evaluate(kvm)

	refused := map[string]*testWorker{
		"another architecture": e.worker([]string{e.project}, allCaps, &wire.WorkerCapabilities{Architectures: []string{"aarch64-linux"}, SystemFeatures: []string{"kvm"}}),
		"missing feature":      e.worker([]string{e.project}, allCaps, x86),
		"not authorized":       e.worker([]string{storage.NewID()}, allCaps, &wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, SystemFeatures: []string{"kvm"}}),
		"no capabilities sent": e.worker([]string{e.project}, allCaps, nil),
		"no build capability":  e.worker([]string{e.project}, wire.GradientCapabilities{Fetch: true, Eval: true}, &wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, SystemFeatures: []string{"kvm"}}),
	}
	for why, w := range refused {
		w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
		if a := w.assigned(); a != nil {
			t.Errorf("worker with %s got %s", why, a.JobID)
		}
	}
	fit := e.worker([]string{e.project}, allCaps, &wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, SystemFeatures: []string{"kvm", "big-parallel"}})
	fit.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := fit.mustAssigned("eligible worker")
	spec := a.Job.(*wire.BuildJob).Builds[0]
	if spec.DrvPath != kvm.DrvPath || spec.TimeoutSecs == nil || *spec.TimeoutSecs != 14400 || spec.MaxSilentSecs == nil || *spec.MaxSilentSecs != 3600 {
		t.Errorf("BuildSpec %+v: want the drv with the default limits", spec)
	}
}

// A registration's enable_fetch / enable_eval / enable_build hold per
// project, whatever the session negotiated for all of them.
func TestProjectAbilities(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	if _, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"}); err != nil {
		t.Fatal(err)
	}
	buildOnly := e.workerWith(map[string]authority.Abilities{e.project: {Build: true}, storage.NewID(): everything}, allCaps, x86)
	buildOnly.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	if a := buildOnly.assigned(); a != nil {
		t.Fatalf("a worker the project allows only builds got its flake job %s", a.JobID)
	}
	evaluator := e.workerWith(map[string]authority.Abilities{e.project: {Fetch: true, Eval: true}}, allCaps, x86)
	evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	evaluator.mustAssigned("a worker the project allows to fetch and evaluate")
}

func TestOwnLimitsAndZeroMeansNone(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	d := leaf("limited")
	seven, zero := uint64(7), uint64(0)
	d.TimeoutSecs, d.MaxSilentSecs = &seven, &zero
	e.evaluate(d)
	w := e.worker([]string{e.project}, allCaps, x86)
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	spec := w.mustAssigned("build").Job.(*wire.BuildJob).Builds[0]
	if spec.TimeoutSecs == nil || *spec.TimeoutSecs != 7 || spec.MaxSilentSecs != nil {
		t.Errorf("limits %v/%v, want 7 and none", spec.TimeoutSecs, spec.MaxSilentSecs)
	}
}

func TestDeclinedJobGoesToAnotherWorker(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	e.evaluate(leaf("one"))
	first := e.worker([]string{e.project}, allCaps, x86)
	first.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := first.mustAssigned("first worker")
	second := e.worker([]string{e.project}, allCaps, x86)
	second.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if second.assigned() != nil {
		t.Fatal("a claimed job was assigned twice")
	}
	reason := "at capacity (1/1)"
	first.send(&wire.AssignJobResponse{JobID: a.JobID, Accepted: false, Reason: &reason})
	b := second.mustAssigned("second worker after the decline")
	if b.JobID != a.JobID || b.AssignmentID == a.AssignmentID {
		t.Errorf("re-assignment %s/%s, want job %s under a fresh assignment", b.JobID, b.AssignmentID, a.JobID)
	}
}

func TestReportsOfOtherSessionsAreDropped(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	ev := e.evaluate(leaf("one"))
	owner := e.worker([]string{e.project}, allCaps, x86)
	owner.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := owner.mustAssigned("owner")
	intruder := e.worker([]string{e.project}, allCaps, x86)
	intruder.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	owner.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: "not-the-assignment"})
	if b := e.build(ev.ID); b.Status != storage.BuildBuilding {
		t.Fatalf("build %s after foreign reports, want still building", b.Status)
	}
	owner.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	if b := e.build(ev.ID); b.Status != storage.BuildSucceeded {
		t.Fatalf("build %s after the owner's report", b.Status)
	}
}

func TestLostSessionRequeuesItsJobs(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	ev := e.evaluate(leaf("one"))
	lost := e.worker([]string{e.project}, allCaps, x86)
	lost.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := lost.mustAssigned("first worker")
	idle := e.worker([]string{e.project}, allCaps, x86)
	idle.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	e.sched.SessionEnded(lost.live, "connection lost")
	b := idle.mustAssigned("idle worker after the loss")
	if b.JobID != a.JobID {
		t.Fatalf("got %s, want the lost job %s", b.JobID, a.JobID)
	}
	idle.send(&wire.JobCompleted{JobID: b.JobID, AssignmentID: b.AssignmentID})
	if got := e.build(ev.ID); got.Status != storage.BuildSucceeded || got.Attempts != 1 {
		t.Errorf("build %s after %d attempts; a lost worker's attempt must not count", got.Status, got.Attempts)
	}
}

// A build that every worker running it loses (a crash, OOM of the worker)
// fails for good after MaxLostWorkers sessions in a row, instead of
// taking down the pool one worker after another.
func TestJobFailsAfterTooManyLostWorkers(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{MaxLostWorkers: 3})
	ev := e.evaluate(leaf("crasher"))
	for i := range 3 {
		w := e.worker([]string{e.project}, allCaps, x86)
		w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
		w.mustAssigned(fmt.Sprintf("worker %d", i+1))
		e.sched.SessionEnded(w.live, "connection lost")
	}
	got := e.build(ev.ID)
	if got.Status != storage.BuildFailed || !strings.Contains(got.Error, "workers in a row were lost") {
		t.Fatalf("build after 3 lost workers: %s (%q), want failed naming the lost workers", got.Status, got.Error)
	}
	next := e.worker([]string{e.project}, allCaps, x86)
	next.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if a := next.assigned(); a != nil {
		t.Fatalf("the failed build was assigned again: %+v", a.Job)
	}
}

func TestTransientFailuresRetryWithBackoffThenFail(t *testing.T) {
	fail := func(w *testWorker, a *wire.AssignJob) {
		w.send(&wire.JobFailed{JobID: a.JobID, AssignmentID: a.AssignmentID, Kind: wire.FailureTransient, Error: "daemon went away", MissingPaths: []string{}})
	}
	t.Run("backoff holds the retry", func(t *testing.T) {
		e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{RetryBackoff: time.Hour})
		e.evaluate(leaf("flaky"))
		w := e.worker([]string{e.project}, allCaps, x86)
		w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
		fail(w, w.mustAssigned("first run"))
		w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
		if a := w.assigned(); a != nil {
			t.Fatalf("retried at once despite a one-hour backoff: %s", a.JobID)
		}
	})
	t.Run("retried, then failed for good", func(t *testing.T) {
		e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{RetryBackoff: -1, MaxAttempts: 3})
		ev := e.evaluate(leaf("flaky"))
		w := e.worker([]string{e.project}, allCaps, x86)
		for run := 1; run <= 3; run++ {
			w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
			fail(w, w.mustAssigned(fmt.Sprintf("run %d", run)))
		}
		w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
		if a := w.assigned(); a != nil {
			t.Errorf("a fourth run after three transient failures")
		}
		if b := e.build(ev.ID); b.Status != storage.BuildFailed || b.FailureKind != storage.FailureTransient {
			t.Errorf("build %s/%s, want failed (transient)", b.Status, b.FailureKind)
		}
	})
}

func TestJobListIsPaged(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	var drvs []wire.DiscoveredDerivation
	for i := range 1500 {
		d := leaf(fmt.Sprintf("d%d", i))
		d.DrvPath = "/nix/store/" + fmt.Sprintf("%032d", i) + "-d.drv"
		drvs = append(drvs, d)
	}
	e.evaluate(drvs...)
	w := e.worker([]string{e.project}, allCaps, x86)
	w.send(&wire.RequestJobList{})
	var pages []*wire.JobListChunk
	for len(w.sent) > 0 {
		if c, ok := (<-w.sent).(*wire.JobListChunk); ok {
			pages = append(pages, c)
		}
	}
	if len(pages) != 2 || len(pages[0].Candidates) != 1000 || pages[0].IsFinal || len(pages[1].Candidates) != 500 || !pages[1].IsFinal {
		t.Fatalf("pages: %d", len(pages))
	}
	if c := pages[0].Candidates[0]; len(c.DrvPaths) != 1 || c.Requirement == nil || c.Requirement.Architecture != "x86_64-linux" {
		t.Errorf("candidate %+v", c)
	}
	// A worker that may run nothing gets one empty, final page.
	other := e.worker([]string{storage.NewID()}, allCaps, x86)
	other.send(&wire.RequestJobList{})
	if c, ok := (<-other.sent).(*wire.JobListChunk); !ok || len(c.Candidates) != 0 || !c.IsFinal {
		t.Errorf("job list of an unauthorized worker: %+v", c)
	}
}

// New jobs are offered to the workers that may run them, and a worker's
// scores steer which job it gets: one whose outputs it already holds
// goes first.
func TestOffersAndScores(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	w := e.worker([]string{e.project}, allCaps, x86)
	stranger := e.worker([]string{storage.NewID()}, allCaps, x86)
	e.evaluate(leaf("one"), leaf("two"))

	offered := map[string]wire.JobCandidate{}
	for len(w.sent) > 0 {
		if o, ok := (<-w.sent).(*wire.JobOffer); ok {
			for _, c := range o.Candidates {
				offered[c.JobID] = c
			}
		}
	}
	var one, two string
	for id, c := range offered {
		switch {
		case len(c.DrvPaths) == 1 && c.DrvPaths[0] == drv("one"):
			one = id
		case len(c.DrvPaths) == 1 && c.DrvPaths[0] == drv("two"):
			two = id
		}
	}
	if one == "" || two == "" {
		t.Fatalf("offers %+v: want both builds", offered)
	}
	for len(stranger.sent) > 0 {
		if o, ok := (<-stranger.sent).(*wire.JobOffer); ok {
			t.Fatalf("a worker of another project was offered %+v", o.Candidates)
		}
	}
	w.send(&wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: one, MissingCount: 3}, {JobID: two, OutputsPresent: true}}, IsFinal: true})
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if a := w.mustAssigned("scored worker"); a.JobID != two {
		t.Errorf("assigned %s, want %s whose outputs the worker holds", a.JobID, two)
	}
}

// Among jobs the worker must download inputs for, the one with the least
// to download goes first; jobs it did not score come after the scored
// ones, in queue order.
func TestScoresPreferTheSmallestDownload(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	w := e.worker([]string{e.project}, allCaps, x86)
	e.evaluate(leaf("old"), leaf("big"), leaf("small"))
	ids := map[string]string{}
	for len(w.sent) > 0 {
		if o, ok := (<-w.sent).(*wire.JobOffer); ok {
			for _, c := range o.Candidates {
				if len(c.DrvPaths) == 1 { // not the flake job
					ids[c.DrvPaths[0]] = c.JobID
				}
			}
		}
	}
	w.send(&wire.RequestJobChunk{Scores: []wire.CandidateScore{
		{JobID: ids[drv("big")], MissingCount: 1, MissingNarSize: 1 << 30},
		{JobID: ids[drv("small")], MissingCount: 3, MissingNarSize: 1 << 10},
	}, IsFinal: true})
	var order []string
	for range 3 {
		w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
		a := w.mustAssigned("build")
		order = append(order, a.Job.(*wire.BuildJob).Builds[0].DrvPath)
		w.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	}
	if want := []string{drv("small"), drv("big"), drv("old")}; !slices.Equal(order, want) {
		t.Fatalf("assigned %v, want %v", order, want)
	}
}

// Import from derivation: the evaluating worker's ImportRequest gets the
// asked-for derivation (and its input) built while the evaluation runs,
// then ImportResult Completed; a failure answers Failed; a derivation the
// evaluation never reported answers Unknown.
func TestImportFromDerivation(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	if _, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"}); err != nil {
		t.Fatal(err)
	}
	evaluator := e.worker([]string{e.project}, wire.GradientCapabilities{Fetch: true, Eval: true}, nil)
	evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	fj := evaluator.mustAssigned("flake job")
	gen, ifd, bad := leaf("gen"), leaf("ifd"), leaf("bad")
	gen.Attr = ""
	ifd.Attr, ifd.IFD, ifd.Dependencies = "other.x86_64-linux.ifd", true, []string{gen.DrvPath}
	// bad depends on ifd, so that neither streams as an ordinary build
	// before the import requests ask for them (a leaf would: builds of an
	// evaluation start while it evaluates).
	bad.Attr, bad.IFD, bad.Dependencies = "other.x86_64-linux.bad", true, []string{ifd.DrvPath}
	evaluator.send(&wire.JobUpdate{JobID: fj.JobID, AssignmentID: fj.AssignmentID, Update: &wire.JobUpdateEvalResult{
		Derivations: []wire.DiscoveredDerivation{gen, ifd, bad}, Warnings: []string{}, Errors: []string{}}})

	builder := e.worker([]string{e.project}, allCaps, x86)
	build := func(fail bool) string {
		t.Helper()
		builder.send(&wire.RequestJob{Kind: wire.JobKindBuild})
		a := builder.mustAssigned("an import build")
		drvPath := a.Job.(*wire.BuildJob).Builds[0].DrvPath
		if fail {
			builder.send(&wire.JobFailed{JobID: a.JobID, AssignmentID: a.AssignmentID, Kind: wire.FailurePermanent, Error: "boom", MissingPaths: []string{}})
		} else {
			builder.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
		}
		return drvPath
	}
	result := func(requestID string) wire.ImportOutcome {
		t.Helper()
		for len(evaluator.sent) > 0 {
			if r, ok := (<-evaluator.sent).(*wire.ImportResult); ok && r.RequestID == requestID {
				return r.Outcome
			}
		}
		return nil
	}

	evaluator.send(&wire.ImportRequest{JobID: fj.JobID, RequestID: "r1", DrvPaths: []string{ifd.DrvPath}})
	if got := build(false); got != gen.DrvPath {
		t.Fatalf("first import build %s, want ifd's input %s", got, gen.DrvPath)
	}
	if o := result("r1"); o != nil {
		t.Fatalf("answered %T before ifd was built", o)
	}
	if got := build(false); got != ifd.DrvPath {
		t.Fatalf("second import build %s, want %s", got, ifd.DrvPath)
	}
	if _, ok := result("r1").(*wire.ImportCompleted); !ok {
		t.Fatal("no ImportResult Completed once ifd was built")
	}

	evaluator.send(&wire.ImportRequest{JobID: fj.JobID, RequestID: "r2", DrvPaths: []string{bad.DrvPath}})
	build(true)
	if f, ok := result("r2").(*wire.ImportFailed); !ok || f.DrvPath != bad.DrvPath {
		t.Fatalf("failed import: %+v, want Failed naming %s", f, bad.DrvPath)
	}

	evaluator.send(&wire.ImportRequest{JobID: fj.JobID, RequestID: "r3", DrvPaths: []string{drv("never-reported")}})
	if u, ok := result("r3").(*wire.ImportUnknown); !ok || u.DrvPath != drv("never-reported") {
		t.Fatalf("unknown import: %+v", u)
	}
	// A session that does not hold the job is refused at once.
	builder.send(&wire.ImportRequest{JobID: fj.JobID, RequestID: "r4", DrvPaths: []string{ifd.DrvPath}})
	for len(builder.sent) > 0 {
		if r, ok := (<-builder.sent).(*wire.ImportResult); ok && r.RequestID == "r4" {
			return
		}
	}
	t.Fatal("an ImportRequest of a foreign job was left unanswered")
}

// Log lines are stored in order and completely by the time the job's end
// is recorded, however many chunks they came in.
func TestBuildLogIsCompleteAtTheEnd(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	ev := e.evaluate(leaf("chatty"))
	w := e.worker([]string{e.project}, allCaps, x86)
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := w.mustAssigned("build")
	var want []byte
	for i := range 500 {
		line := []byte(fmt.Sprintf("line %d of the build\n", i))
		want = append(want, line...)
		w.send(&wire.LogChunk{JobID: a.JobID, Data: line})
	}
	w.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	got, err := jobqueue.New(e.db).BuildLog(t.Context(), e.build(ev.ID).ID)
	if err != nil || string(got) != string(want) {
		t.Fatalf("stored log (%d bytes, %v) differs from the %d bytes sent", len(got), err, len(want))
	}
}

// A derivation whose outputs the project's cache already holds is not
// built: it succeeds at once, and its dependents become runnable.
func TestCachedOutputsAreNotRebuilt(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	pushed := leaf("pushed")
	if _, _, err := e.db.PutCachePath(t.Context(), storage.CachePath{CacheID: e.cache, StorePath: pushed.Outputs[0].Path,
		NarHash: "sha256:" + strings.Repeat("0", 52), NarSize: 120, FileHash: "sha256:" + strings.Repeat("1", 52), FileSize: 80,
		Compression: "zstd", ObjectKey: strings.Repeat("1", 52)}); err != nil {
		t.Fatal(err)
	}
	user := leaf("user")
	user.Dependencies = []string{pushed.DrvPath}
	ev := e.evaluate(pushed, user)
	builds, err := jobqueue.New(e.db).EvaluationBuilds(t.Context(), ev.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range builds {
		if b.DrvPath == pushed.DrvPath && (b.Status != storage.BuildSucceeded || b.StatusText() != "cached" || b.WorkerID != "" || len(b.OutputInfo) != 1) {
			t.Errorf("cached build: %s on %q with %v; want succeeded without a worker", b.Status, b.WorkerID, b.OutputInfo)
		}
	}
	w := e.worker([]string{e.project}, allCaps, x86)
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if got := w.mustAssigned("the dependent").Job.(*wire.BuildJob).Builds[0].DrvPath; got != user.DrvPath {
		t.Fatalf("assigned %s, want only the dependent %s", got, user.DrvPath)
	}
}

// On PostgreSQL a build's completion is recorded beside its session, and
// concurrent completions share statements: many workers completing at
// once (each report twice) still record every build once, ready the
// dependent once, and end the evaluation.
func TestConcurrentCompletionsOnPostgres(t *testing.T) {
	e := newLoopEnv(t, storagetest.PostgresURL(t), scheduler.Config{})
	var leaves []wire.DiscoveredDerivation
	var deps []string
	for i := range 12 {
		l := leaf(fmt.Sprintf("leaf%02d", i))
		leaves = append(leaves, l)
		deps = append(deps, l.DrvPath)
	}
	top := leaf("top")
	top.Dependencies = deps
	ev := e.evaluate(append(leaves, top)...)
	var workers []*testWorker
	var assignments []*wire.AssignJob
	for range leaves {
		w := e.worker([]string{e.project}, allCaps, x86)
		w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
		workers = append(workers, w)
		assignments = append(assignments, w.mustAssigned("a leaf"))
	}
	var wg sync.WaitGroup
	for i, w := range workers {
		a := assignments[i]
		wg.Go(func() {
			done := &wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID}
			e.sched.HandleJobMessage(w.live, done)
			e.sched.HandleJobMessage(w.live, done) // a repeated report is dropped
		})
	}
	wg.Wait()
	e.sched.WaitRecorded()
	last := e.worker([]string{e.project}, allCaps, x86)
	last.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := last.mustAssigned("the dependent of every leaf")
	if got := a.Job.(*wire.BuildJob).Builds[0].DrvPath; got != top.DrvPath {
		t.Fatalf("assigned %s, want %s", got, top.DrvPath)
	}
	last.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	builds, err := jobqueue.New(e.db).EvaluationBuilds(t.Context(), ev.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range builds {
		if b.Status != storage.BuildSucceeded || b.Attempts != 1 {
			t.Errorf("build %s: %s after %d attempts, want succeeded after 1", b.DrvPath, b.Status, b.Attempts)
		}
	}
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		got, err := jobqueue.New(e.db).Evaluation(t.Context(), ev.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status == storage.EvaluationSucceeded {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("evaluation %s, want succeeded", got.Status)
		}
	}
}

// A build's candidate names the outputs of its input derivations, with
// their sizes once the project's cache holds them (docs/protocol/jobs.md §3.1), so
// workers score by what they would have to download.
func TestCandidatesNameRequiredPaths(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	lib, app := leaf("lib"), leaf("app")
	app.Dependencies = []string{lib.DrvPath}
	e.evaluate(lib, app)
	w := e.worker([]string{e.project}, allCaps, x86)
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := w.mustAssigned("lib")
	libOut := lib.Outputs[0].Path
	// The worker pushes the output, then reports it.
	if _, _, err := e.db.PutCachePath(t.Context(), storage.CachePath{CacheID: e.cache, StorePath: libOut,
		NarHash: "sha256:" + strings.Repeat("0", 52), NarSize: 120, FileHash: "sha256:" + strings.Repeat("1", 52), FileSize: 80,
		Compression: "zstd", ObjectKey: strings.Repeat("1", 52)}); err != nil {
		t.Fatal(err)
	}
	w.send(&wire.JobUpdate{JobID: a.JobID, AssignmentID: a.AssignmentID, Update: &wire.JobUpdateBuildOutput{
		Outputs: []wire.BuildOutput{{Name: "out", StorePath: libOut}}}})
	w.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})

	want := []wire.RequiredPath{{Path: libOut, CacheInfo: &wire.CacheInfo{FileSize: 80, NarSize: 120}}}
	check := func(how string, c wire.JobCandidate) {
		t.Helper()
		if len(c.DrvPaths) != 1 || c.DrvPaths[0] != app.DrvPath {
			t.Fatalf("%s: candidate %+v, want %s", how, c, app.DrvPath)
		}
		if len(c.RequiredPaths) != 1 || c.RequiredPaths[0].Path != want[0].Path || c.RequiredPaths[0].CacheInfo == nil ||
			*c.RequiredPaths[0].CacheInfo != *want[0].CacheInfo {
			t.Fatalf("%s: required paths %+v, want %s with file 80 / NAR 120", how, c.RequiredPaths, libOut)
		}
	}
	offered := false
	for len(w.sent) > 0 {
		if o, ok := (<-w.sent).(*wire.JobOffer); ok {
			for _, c := range o.Candidates {
				check("JobOffer", c)
				offered = true
			}
		}
	}
	if !offered {
		t.Fatal("the dependent was not offered once its input was built")
	}
	w.send(&wire.RequestJobList{})
	page, ok := (<-w.sent).(*wire.JobListChunk)
	if !ok || len(page.Candidates) != 1 || !page.IsFinal {
		t.Fatalf("job list %+v", page)
	}
	check("JobListChunk", page.Candidates[0])
	// The queue is read again (a new evaluation): the paths stay.
	if _, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "def"}); err != nil {
		t.Fatal(err)
	}
	for len(w.sent) > 0 {
		<-w.sent
	}
	w.send(&wire.RequestJobList{})
	page, ok = (<-w.sent).(*wire.JobListChunk)
	if !ok || len(page.Candidates) != 2 {
		t.Fatalf("job list after the reload %+v, want the build and the new flake job", page)
	}
	for _, c := range page.Candidates {
		if len(c.DrvPaths) == 1 {
			check("JobListChunk after a reload", c)
		}
	}
}

// Flake-job splitting (docs/protocol/jobs.md §6): while a worker that may evaluate but
// not fetch waits, a fetching worker gets the fetch step alone; the job
// then returns, under the same ID, for the evaluator, with the fetched
// source from the cache as its one required path.
func TestFlakeJobSplitForEvalOnlyWorker(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	ev, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"})
	if err != nil {
		t.Fatal(err)
	}
	evaluator := e.worker([]string{e.project}, wire.GradientCapabilities{Eval: true}, nil)
	evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	if a := evaluator.assigned(); a != nil {
		t.Fatalf("a worker that may not fetch got %+v before the source was fetched", a.Job)
	}
	fetcher := e.worker([]string{e.project}, wire.GradientCapabilities{Fetch: true, Eval: true}, nil)
	fetcher.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	fa := fetcher.mustAssigned("fetch")
	flake := fa.Job.(*wire.FlakeJob)
	if !slices.Equal(flake.Steps, []wire.FlakeStep{wire.FlakeStepFetchFlake}) {
		t.Fatalf("fetching worker got steps %v while an evaluator waits; want the fetch step alone", flake.Steps)
	}
	if src, ok := flake.Source.(*wire.FlakeSourceRepository); !ok || src.Commit != "abc" {
		t.Fatalf("fetch source %+v", flake.Source)
	}
	const source = "/nix/store/00000000000000000000000000000src-source"
	fetcher.send(&wire.JobUpdate{JobID: fa.JobID, AssignmentID: fa.AssignmentID, Update: &wire.JobUpdateFetchResult{FlakeSource: ptr(source)}})
	fetcher.send(&wire.JobCompleted{JobID: fa.JobID, AssignmentID: fa.AssignmentID})

	ea := evaluator.mustAssigned("evaluation of the fetched source")
	flake = ea.Job.(*wire.FlakeJob)
	if ea.JobID != fa.JobID || ea.AssignmentID == fa.AssignmentID {
		t.Fatalf("follow-up job %s/%s, want job %s under a new assignment", ea.JobID, ea.AssignmentID, fa.JobID)
	}
	if !slices.Equal(flake.Steps, []wire.FlakeStep{wire.FlakeStepEvaluateFlake, wire.FlakeStepEvaluateDerivations}) {
		t.Fatalf("follow-up steps %v", flake.Steps)
	}
	if src, ok := flake.Source.(*wire.FlakeSourceCached); !ok || src.StorePath != source {
		t.Fatalf("follow-up source %+v, want the cached %s", flake.Source, source)
	}
	got, err := jobqueue.New(e.db).Evaluation(t.Context(), ev.ID)
	if err != nil || got.Status != storage.EvaluationEvaluating || got.FlakeSource != source {
		t.Fatalf("evaluation after the follow-up's claim: %+v, %v", got, err)
	}
	evaluator.send(&wire.JobUpdate{JobID: ea.JobID, AssignmentID: ea.AssignmentID, Update: &wire.JobUpdateEvalResult{
		Derivations: []wire.DiscoveredDerivation{leaf("one")}, Warnings: []string{}, Errors: []string{}}})
	evaluator.send(&wire.JobCompleted{JobID: ea.JobID, AssignmentID: ea.AssignmentID})
	if got, _ := jobqueue.New(e.db).Evaluation(t.Context(), ev.ID); got.Status != storage.EvaluationBuilding || got.Attempts != 1 {
		t.Fatalf("evaluation %s after %d attempt(s), want building after 1 (the fetch does not count)", got.Status, got.Attempts)
	}
	if b := e.build(ev.ID); b.DrvPath != drv("one") || b.Status != storage.BuildQueued {
		t.Fatalf("build %+v", b)
	}
}

// A worker that may fetch but not evaluate gets fetch steps only; a
// fetched job is offered to evaluators with its source as required path;
// a fetch that completes without naming its source fails the evaluation.
func TestFetchOnlyWorker(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	start := func() storage.Evaluation {
		ev, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "abc"})
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	fetcher := e.worker([]string{e.project}, wire.GradientCapabilities{Fetch: true}, nil)

	silent := start()
	fetcher.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	a := fetcher.mustAssigned("fetch")
	if steps := a.Job.(*wire.FlakeJob).Steps; !slices.Equal(steps, []wire.FlakeStep{wire.FlakeStepFetchFlake}) {
		t.Fatalf("fetch-only worker got steps %v", steps)
	}
	fetcher.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	if got, _ := jobqueue.New(e.db).Evaluation(t.Context(), silent.ID); got.Status != storage.EvaluationFailed || !strings.Contains(got.Error, "FetchResult") {
		t.Fatalf("evaluation whose fetch named no source: %s (%q), want failed naming the missing FetchResult", got.Status, got.Error)
	}

	start()
	fetcher.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	a = fetcher.mustAssigned("fetch")
	const source = "/nix/store/00000000000000000000000000000src-source"
	fetcher.send(&wire.JobUpdate{JobID: a.JobID, AssignmentID: a.AssignmentID, Update: &wire.JobUpdateFetchResult{FlakeSource: ptr(source)}})
	fetcher.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	fetcher.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	if again := fetcher.assigned(); again != nil {
		t.Fatalf("the fetch-only worker got the evaluation: %+v", again.Job)
	}
	evaluator := e.worker([]string{e.project}, wire.GradientCapabilities{Eval: true}, nil)
	evaluator.send(&wire.RequestJobList{})
	page, ok := (<-evaluator.sent).(*wire.JobListChunk)
	if !ok || len(page.Candidates) != 1 || page.Candidates[0].JobID != a.JobID ||
		len(page.Candidates[0].RequiredPaths) != 1 || page.Candidates[0].RequiredPaths[0].Path != source {
		t.Fatalf("evaluator's job list %+v, want the fetched job requiring %s", page, source)
	}
}

func ptr[T any](v T) *T { return &v }

// A draining worker is handed nothing and offered nothing (docs/protocol/jobs.md §6):
// its RequestJob stays unanswered while another worker gets the job.
func TestDrainingWorkerGetsNoJobs(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	draining := e.worker([]string{e.project}, allCaps, x86)
	authoritytest.Drain(draining.live)
	draining.send(&wire.ClientDraining{})
	draining.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	draining.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	ev := e.evaluate(leaf("one"))
	for len(draining.sent) > 0 {
		switch m := (<-draining.sent).(type) {
		case *wire.AssignJob:
			t.Fatalf("a draining worker was assigned %+v", m.Job)
		case *wire.JobOffer:
			t.Fatalf("a draining worker was offered %+v", m.Candidates)
		}
	}
	other := e.worker([]string{e.project}, allCaps, x86)
	other.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if got := other.mustAssigned("the build").Job.(*wire.BuildJob).Builds[0].BuildID; got != e.build(ev.ID).ID {
		t.Fatalf("assigned build %s", got)
	}
}

// A project's deploy key reaches the worker that fetches it, in a
// Credential right before the AssignJob (docs/protocol/jobs.md §5.2), and no other.
func TestDeployKeyGoesWithTheFetch(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	srv := server.New(e.db, server.Config{DialKey: e.secrets, DeployKeys: deploykeys.New(e.db, e.secrets), Logger: slog.New(slog.DiscardHandler)})
	defer srv.Close()
	project, err := e.db.Project(t.Context(), e.project)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.GenerateDeployKey(t.Context(), project, "test"); err != nil {
		t.Fatal(err)
	}
	private, err := deploykeys.New(e.db, e.secrets).Private(t.Context(), e.project)
	if err != nil || len(private) == 0 {
		t.Fatalf("private key %q, %v", private, err)
	}
	if _, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "ssh://git@example.invalid/p.git", Commit: "abc"}); err != nil {
		t.Fatal(err)
	}
	evaluator := e.worker([]string{e.project}, wire.GradientCapabilities{Eval: true}, nil)
	evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	fetcher := e.worker([]string{e.project}, wire.GradientCapabilities{Fetch: true}, nil)
	fetcher.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	cred, ok := (<-fetcher.sent).(*wire.Credential)
	if !ok || cred.Kind != wire.CredentialSSHKey || string(cred.Data) != string(private) {
		t.Fatalf("first message to the fetching worker %+v, want Credential SshKey with the project's key", cred)
	}
	a, ok := (<-fetcher.sent).(*wire.AssignJob)
	if !ok {
		t.Fatal("no AssignJob after the Credential")
	}
	source := "/nix/store/00000000000000000000000000000src-source"
	fetcher.send(&wire.JobUpdate{JobID: a.JobID, AssignmentID: a.AssignmentID, Update: &wire.JobUpdateFetchResult{FlakeSource: &source}})
	fetcher.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	for len(evaluator.sent) > 0 {
		if c, ok := (<-evaluator.sent).(*wire.Credential); ok {
			t.Fatalf("the evaluating worker, which does not fetch, got the deploy key %+v", c.Kind)
		}
	}
}

// A running build's latest BuildProgress is kept for the operator's view
// while it builds and is fresh; reports of other sessions are dropped.
func TestBuildProgressWhileBuilding(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	ev := e.evaluate(leaf("one"))
	w := e.worker([]string{e.project}, allCaps, x86)
	other := e.worker([]string{e.project}, allCaps, x86)
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := w.mustAssigned("build")
	buildID := e.build(ev.ID).ID
	if _, ok := e.sched.BuildProgress(buildID); ok {
		t.Fatal("progress before any report")
	}
	w.send(&wire.BuildProgress{JobID: a.JobID, AssignmentID: a.AssignmentID, BuildID: buildID, Phase: wire.ProgressUpload, BytesDone: 10, PathsDone: 1})
	other.send(&wire.BuildProgress{JobID: a.JobID, AssignmentID: a.AssignmentID, BuildID: buildID, Phase: wire.ProgressUpload, BytesDone: 99, PathsDone: 9})
	if p, ok := e.sched.BuildProgress(buildID); !ok || p.BytesDone != 10 || p.PathsDone != 1 || p.Phase != wire.ProgressUpload {
		t.Fatalf("progress %+v, %v; want the running session's report only", p, ok)
	}
	restore := scheduler.SetProgressTTL(20 * time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	if _, ok := e.sched.BuildProgress(buildID); ok {
		t.Fatal("a stale report is still shown")
	}
	restore()
	w.send(&wire.BuildProgress{JobID: a.JobID, AssignmentID: a.AssignmentID, BuildID: buildID, Phase: wire.ProgressUpload, BytesDone: 20, PathsDone: 2})
	w.send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	if _, ok := e.sched.BuildProgress(buildID); ok {
		t.Fatal("progress of a finished build is still shown")
	}
}
