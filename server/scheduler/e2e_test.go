package scheduler_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/examples"
	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/metrics"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/deploykeys"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }

// e2eFlake: a package to build, and checks that fail, time out or run
// until cancelled. (The DAG test builds the shipped example flake.)
const e2eFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: extra: builtins.derivation ({
      inherit name system; builder = "/bin/sh"; args = [ "-c" script ];
    } // extra);
    line = dep: "read v < ${dep}; ";
  in rec {
    packages.${system}.greeting = step "greeting" "echo building greeting; echo hello > $out" {};
    checks.${system} = rec {
      broken = step "broken" "echo about to fail; exit 1" {};
      after = step "after" "${line broken} echo never > $out" {};
      sleepy = step "sleepy" "while true; do echo still here; /bin/sleep 1; done" { timeout = 2; };
      slow = step "slow" "while true; do echo working; /bin/sleep 1; done" {};
    };
  };
}
`

type world struct {
	t       *testing.T
	db      *storage.DB
	sched   *scheduler.Scheduler
	url     string
	httpURL string
	project storage.Project
	cache   storage.Cache
	repo    string
	commit  string
	secrets *sealbox.Box // seals deploy keys
	ssh     string       // the workers' ssh program ("" = ssh)
	// metrics holds the server's, the job loop's and every worker's
	// series (each worker's labelled with its ID), as gradient up does.
	metrics *prometheus.Registry
}

func newWorld(t *testing.T, dbURL string, workers int) *world {
	t.Helper()
	return newWorldWith(t, dbURL, workers, scheduler.Config{})
}

// newWorldWith is newWorld with a job loop configured by cfg (its metrics,
// logger, tick and deploy keys are the world's).
func newWorldWith(t *testing.T, dbURL string, workers int, cfg scheduler.Config) *world {
	t.Helper()
	db := testworld.Open(t, dbURL)
	reg := metrics.NewRegistry()
	secrets, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Metrics, cfg.Logger, cfg.Tick = reg, slog.New(slog.DiscardHandler), 200*time.Millisecond
	cfg.DeployKeys = deploykeys.New(db, secrets)
	sched := scheduler.New(db, cfg)
	if err := sched.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Close)
	w := &world{t: t, db: db, sched: sched, secrets: secrets, metrics: reg}
	w.url, w.httpURL = testworld.Serve(t, db, server.Config{Jobs: sched, Metrics: reg})
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": e2eFlake})
	w.project, w.cache = testworld.Project(t, db, w.repo)
	for range workers {
		w.startWorker()
	}
	return w
}

// startWorker runs a worker with every capability and a store of its own.
func (w *world) startWorker() string {
	return w.startWorkerWith(wire.GradientCapabilities{Fetch: true, Eval: true, Build: true})
}

// startWorkerWith runs a worker with the capabilities and a store of its own.
func (w *world) startWorkerWith(caps wire.GradientCapabilities) string {
	id, peers := testworld.Register(w.t, w.db, w.project.ID)
	testworld.RunWorker(w.t, worker.Config{
		Session: workersession.Config{
			ServerURL: w.url, WorkerID: id, Peers: peers,
			Capabilities: caps,
			Heartbeat:    2 * time.Second, BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
			Metrics: prometheus.WrapRegistererWith(prometheus.Labels{"worker": id}, w.metrics),
		},
		CPUCoreScore: 1,
		Executor: &nixexec.Executor{Nix: nixtest.Trusting(w.t, w.cache.PublicKey()), Logger: slog.New(slog.DiscardHandler), SSH: w.ssh,
			AllowLocalRepositories: true}, // the world's repository is local
		TempDir: w.t.TempDir(),
	})
	return id
}

func (w *world) evaluate(wildcards ...string) storage.Evaluation {
	w.t.Helper()
	ev, err := w.sched.StartEvaluation(w.t.Context(), storage.NewEvaluation{ProjectID: w.project.ID, RepositoryURL: w.repo, Commit: w.commit, Wildcards: wildcards})
	if err != nil {
		w.t.Fatal(err)
	}
	return ev
}

// waitFor polls the evaluation until cond holds.
func (w *world) waitFor(id, what string, timeout time.Duration, cond func(storage.Evaluation, []storage.Build) bool) (storage.Evaluation, []storage.Build) {
	w.t.Helper()
	return testworld.WaitForEvaluation(w.t, w.db, id, what, timeout, cond)
}

func (w *world) waitDone(id string) (storage.Evaluation, []storage.Build) {
	return w.waitFor(id, "the end", 3*time.Minute, func(ev storage.Evaluation, _ []storage.Build) bool { return ev.Status.Terminal() })
}

func byAttr(builds []storage.Build) map[string]storage.Build {
	m := map[string]storage.Build{}
	for _, b := range builds {
		m[b.Attr[strings.LastIndex(b.Attr, ".")+1:]] = b
	}
	return m
}

// TestExampleFlakeOnThreeWorkers: the example flake gradient up ships is
// fetched, evaluated and built by three workers in dependency order; the
// outputs are in the cache, signed, and a real Nix fetches them.
func TestExampleFlakeOnThreeWorkers(t *testing.T) {
	w := newWorld(t, storagetest.SQLiteURL(t), 3)
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": string(examples.FlakeNix)})
	ev, builds := w.waitDone(w.evaluate("packages.x86_64-linux.*").ID)
	if ev.Status != storage.EvaluationSucceeded {
		log, _ := jobqueue.New(w.db).EvaluationLog(t.Context(), ev.ID)
		t.Fatalf("evaluation %s: %s (%s)\nlog:\n%s", ev.Status, ev.Error, ev.FlakeSource, log)
	}
	b := byAttr(builds)
	workers := map[string]bool{}
	for _, name := range examples.FlakeAttrs {
		build, ok := b[name]
		if !ok || build.Status != storage.BuildSucceeded || len(build.OutputInfo) != 1 {
			t.Fatalf("build %s: %+v", name, build)
		}
		workers[build.WorkerID] = true
	}
	// The DAG: greeting ─ shout, repeat, count ─ report; nothing started
	// before its inputs finished.
	for _, mid := range []string{"shout", "repeat", "count"} {
		if b[mid].StartedAt.Before(b["greeting"].FinishedAt) {
			t.Errorf("%s started %s before greeting finished %s", mid, b[mid].StartedAt, b["greeting"].FinishedAt)
		}
		if b["report"].StartedAt.Before(b[mid].FinishedAt) {
			t.Errorf("report started before %s finished", mid)
		}
	}
	if len(workers) < 2 {
		t.Errorf("every build ran on one worker (%v); three idle workers should share the parallel builds", workers)
	}
	log, err := jobqueue.New(w.db).BuildLog(t.Context(), b["count"].ID)
	if err != nil || !strings.Contains(string(log), "the greeting has 3 words") {
		t.Errorf("count's stored log %q, %v", log, err)
	}

	// A real Nix fetches report (and its closure) from the HTTP cache with
	// the cache's key trusted and signatures checked.
	client := nixtest.New(t)
	out := b["report"].OutputInfo[0].StorePath
	if err := client.CopyFrom(t.Context(), w.httpURL+"/cache/main", []string{w.cache.PublicKey()}, out); err != nil {
		t.Fatalf("nix copy from the cache: %v", err)
	}
	content, err := os.ReadFile(filepath.Join(client.Store, out))
	if err != nil || !strings.Contains(string(content), "hello from gradient!") || !strings.Contains(string(content), "count: 3 words") {
		t.Errorf("report's output %q, %v", content, err)
	}
}

// TestFailuresTimeoutsAndCancel: a failing derivation fails its
// dependent without building it; a build past its timeout ends timed
// out; cancelling an evaluation aborts its running build.
func TestFailuresTimeoutsAndCancel(t *testing.T) {
	w := newWorld(t, storagetest.SQLiteURL(t), 2)

	ev, builds := w.waitDone(w.evaluate("checks.x86_64-linux.broken", "checks.x86_64-linux.after").ID)
	b := byAttr(builds)
	if ev.Status != storage.EvaluationFailed || b["broken"].Status != storage.BuildFailed || b["broken"].FailureKind != storage.FailurePermanent {
		t.Fatalf("evaluation %s, broken %s/%s, want failed and a permanent build failure", ev.Status, b["broken"].Status, b["broken"].FailureKind)
	}
	if b["after"].Status != storage.BuildDependencyFailed || !b["after"].StartedAt.IsZero() || b["after"].WorkerID != "" {
		t.Errorf("after: %s, started %v on %q; want dependency failed and never built", b["after"].Status, b["after"].StartedAt, b["after"].WorkerID)
	}

	ev, builds = w.waitDone(w.evaluate("checks.x86_64-linux.sleepy").ID)
	if s := byAttr(builds)["sleepy"]; s.StatusText() != "timed out" || ev.Status != storage.EvaluationFailed {
		t.Errorf("sleepy: %s (%s), evaluation %s; want timed out", s.StatusText(), s.Error, ev.Status)
	}

	slow := w.evaluate("checks.x86_64-linux.slow")
	w.waitFor(slow.ID, "slow building", 2*time.Minute, func(_ storage.Evaluation, builds []storage.Build) bool {
		return len(builds) == 1 && builds[0].Status == storage.BuildBuilding
	})
	time.Sleep(500 * time.Millisecond) // let the builder run
	if err := w.sched.CancelEvaluation(t.Context(), slow.ID); err != nil {
		t.Fatal(err)
	}
	ev, builds = w.waitDone(slow.ID)
	if ev.Status != storage.EvaluationCancelled || builds[0].Status != storage.BuildCancelled {
		t.Errorf("cancelled evaluation %s, build %s", ev.Status, builds[0].Status)
	}
	// The worker that ran it is free again: a new evaluation completes.
	ev, _ = w.waitDone(w.evaluate("packages.x86_64-linux.greeting").ID)
	if ev.Status != storage.EvaluationSucceeded {
		t.Errorf("evaluation after the cancel: %s (%s)", ev.Status, ev.Error)
	}

	// A target that matches nothing fails the evaluation, after building
	// what the others found.
	ev, builds = w.waitDone(w.evaluate("packages.x86_64-linux.greeting", "packages.x86_64-linux.nosuch").ID)
	if ev.Status != storage.EvaluationFailed || !strings.Contains(ev.Error, "nosuch") || len(builds) != 1 || builds[0].Status != storage.BuildSucceeded {
		t.Errorf("evaluation with an unmatched target: %s (%q), builds %+v", ev.Status, ev.Error, builds)
	}
}

// TestSplitFetchAndEvaluate: a worker that only fetches and one that
// evaluates and builds but may not fetch run an evaluation together: the
// fetched source travels through the cache (docs/protocol/jobs.md §16.3). Only the
// fetcher can fetch, only the evaluator evaluate and build.
func TestSplitFetchAndEvaluate(t *testing.T) {
	w := newWorld(t, storagetest.SQLiteURL(t), 0)
	evaluator := w.startWorkerWith(wire.GradientCapabilities{Eval: true, Build: true})
	w.startWorkerWith(wire.GradientCapabilities{Fetch: true})
	ev, builds := w.waitDone(w.evaluate("packages.x86_64-linux.greeting").ID)
	if ev.Status != storage.EvaluationSucceeded || len(builds) != 1 || builds[0].WorkerID != evaluator {
		log, _ := jobqueue.New(w.db).EvaluationLog(t.Context(), ev.ID)
		t.Fatalf("evaluation %s (%q), builds %+v; want greeting built by the evaluator\nlog:\n%s", ev.Status, ev.Error, builds, log)
	}
	if ev.FlakeSource == "" {
		t.Fatal("no fetched source recorded")
	}
}

// TestSplitEvaluationGetsPrivateInputsFromTheCache: the flake's input is
// reachable only by the fetching worker (its repository is gone before
// the evaluator starts); the evaluator pulls it from the cache, where the
// fetch put it.
func TestSplitEvaluationGetsPrivateInputsFromTheCache(t *testing.T) {
	w := newWorld(t, storagetest.SQLiteURL(t), 0)
	lib, _ := nixtest.Repo(t, map[string]string{"flake.nix": `{ outputs = { self }: { lib.word = "private"; }; }`})
	app, _ := nixtest.Repo(t, map[string]string{"flake.nix": `{
  inputs.lib.url = "git+file://` + lib + `";
  outputs = { self, lib }: {
    packages.x86_64-linux.word = builtins.derivation {
      name = "word"; system = "x86_64-linux"; builder = "/bin/sh"; args = [ "-c" "echo ${lib.lib.word} > $out" ];
    };
  };
}`})
	w.repo, w.commit = app, nixtest.Lock(t, app)
	w.startWorkerWith(wire.GradientCapabilities{Fetch: true})
	ev := w.evaluate("packages.x86_64-linux.word")
	w.waitFor(ev.ID, "the fetch", 2*time.Minute, func(ev storage.Evaluation, _ []storage.Build) bool {
		return ev.FlakeSource != "" && ev.Status == storage.EvaluationQueued
	})
	if err := os.RemoveAll(lib); err != nil {
		t.Fatal(err)
	}
	w.startWorkerWith(wire.GradientCapabilities{Eval: true, Build: true})
	done, builds := w.waitDone(ev.ID)
	if done.Status != storage.EvaluationSucceeded || len(builds) != 1 || builds[0].Status != storage.BuildSucceeded {
		log, _ := jobqueue.New(w.db).EvaluationLog(t.Context(), ev.ID)
		t.Fatalf("evaluation %s (%q), builds %+v\nlog:\n%s", done.Status, done.Error, builds, log)
	}
}

// TestPrivateRepositoryWithDeployKey: a repository reached over SSH is
// fetched with the project's deploy key (the workers' "ssh" serves it
// only to a caller presenting an OpenSSH key).
func TestPrivateRepositoryWithDeployKey(t *testing.T) {
	w := newWorld(t, storagetest.SQLiteURL(t), 0)
	w.ssh = nixtest.NewSSHHost(t).Program
	w.startWorker()
	w.repo = "ssh://git.example.invalid" + w.repo

	// Without a deploy key the worker's own ssh cannot reach the host.
	ev, _ := w.waitDone(w.evaluate("packages.x86_64-linux.greeting").ID)
	if ev.Status != storage.EvaluationFailed || !strings.Contains(ev.Error, "Could not read from remote repository") {
		t.Fatalf("evaluation without a deploy key: %s (%q), want a failed fetch", ev.Status, ev.Error)
	}
	srv := server.New(w.db, server.Config{DialKey: w.secrets, DeployKeys: deploykeys.New(w.db, w.secrets), Logger: slog.New(slog.DiscardHandler)})
	defer srv.Close()
	if _, err := srv.GenerateDeployKey(t.Context(), w.project, "test"); err != nil {
		t.Fatal(err)
	}
	ev, builds := w.waitDone(w.evaluate("packages.x86_64-linux.greeting").ID)
	if ev.Status != storage.EvaluationSucceeded || len(builds) != 1 || builds[0].Status != storage.BuildSucceeded {
		t.Fatalf("evaluation with the deploy key: %s (%q), builds %+v", ev.Status, ev.Error, builds)
	}
}
