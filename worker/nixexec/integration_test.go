package nixexec_test

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/nix/narsig"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }

// testFlake's derivations need nothing but /bin/sh (no nixpkgs, offline).
const testFlake = `{
  outputs = { self }: let
    sys = "x86_64-linux";
    mk = name: script: builtins.derivation {
      inherit name; system = sys; builder = "/bin/sh"; args = [ "-c" script ];
    };
  in {
    packages.${sys} = rec {
      hello = mk "hello-1.0" "echo building hello; echo hello > $out";
      greet = mk "greet" "echo greeting; read x < ${hello}; echo \"$x world\" > $out";
      broken = mk "broken" "echo about to fail; echo oops-this-fails; exit 3";
      sleepy = mk "sleepy" "echo sleeping; while true; do echo still sleeping; /bin/sleep 1; done";
      silent = mk "silent" "echo one line then silence; /bin/sleep 60; echo done > $out";
    };
  };
}
`

// scriptedLoop is a job loop that hands out the jobs a test queues, each
// to the worker it names, and records every report.
type scriptedLoop struct {
	mu      sync.Mutex
	workers map[string]*authority.LiveWorker // by worker ID
	wants   map[string]map[wire.JobKind]int
	queue   []queued
	reports chan report
	project string // every job's
	// held are the jobs handed out and not yet ended, by job ID.
	held map[string]queued
}

type queued struct {
	workerID string
	job      *wire.AssignJob
}

type report struct {
	workerID string
	msg      wire.ClientMessage
}

func newScriptedLoop() *scriptedLoop {
	return &scriptedLoop{workers: map[string]*authority.LiveWorker{}, wants: map[string]map[wire.JobKind]int{}, reports: make(chan report, 4096),
		held: map[string]queued{}}
}

func (l *scriptedLoop) SessionStarted(w *authority.LiveWorker) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.workers[w.WorkerID] = w
	l.wants[w.WorkerID] = map[wire.JobKind]int{}
}

func (l *scriptedLoop) SessionEnded(w *authority.LiveWorker, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.workers[w.WorkerID] == w {
		delete(l.workers, w.WorkerID)
	}
}

func (l *scriptedLoop) HandleJobMessage(w *authority.LiveWorker, m wire.ClientMessage) {
	if rj, ok := m.(*wire.RequestJob); ok {
		l.mu.Lock()
		l.wants[w.WorkerID][rj.Kind]++
		l.assignLocked()
		l.mu.Unlock()
		return
	}
	switch m := m.(type) {
	case *wire.JobCompleted:
		l.end(m.JobID)
	case *wire.JobFailed:
		l.end(m.JobID)
	}
	l.reports <- report{w.WorkerID, m}
}

func (l *scriptedLoop) end(jobID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, jobID)
}

// JobProducts lets the server take a held job's uploads: a flake job's
// content-addressed paths, a build's outputs as its BuildSpecs name them.
func (l *scriptedLoop) JobProducts(w *authority.LiveWorker, jobID string) (authority.JobProducts, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q, ok := l.held[jobID]
	if !ok || q.workerID != w.WorkerID {
		return authority.JobProducts{}, false
	}
	p := authority.JobProducts{Project: l.project, What: "scripted job " + jobID}
	build, ok := q.job.Job.(*wire.BuildJob)
	if !ok {
		p.ContentAddressed = true
		return p, true
	}
	for _, spec := range build.Builds {
		for _, o := range spec.Outputs {
			p.Outputs = append(p.Outputs, o.Path)
		}
	}
	return p, true
}

// enqueue queues a job for workerID.
func (l *scriptedLoop) enqueue(workerID string, job *wire.AssignJob) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queue = append(l.queue, queued{workerID, job})
	l.assignLocked()
}

func (l *scriptedLoop) assignLocked() {
	l.queue = slices.DeleteFunc(l.queue, func(q queued) bool {
		kind := wire.JobKindFlake
		if _, ok := q.job.Job.(*wire.BuildJob); ok {
			kind = wire.JobKindBuild
		}
		w := l.workers[q.workerID]
		if w == nil || l.wants[q.workerID][kind] == 0 {
			return false
		}
		l.wants[q.workerID][kind]--
		l.held[q.job.JobID] = q
		w.Send(q.job)
		return true
	})
}

func (l *scriptedLoop) send(workerID string, m wire.ServerMessage) {
	l.mu.Lock()
	w := l.workers[workerID]
	l.mu.Unlock()
	w.Send(m)
}

// jobReports collects one job's reports until it completes or fails.
type jobReports struct {
	updates []wire.JobUpdateKind
	logs    bytes.Buffer
	evalMsg []*wire.EvalMessage
	failed  *wire.JobFailed
}

func (r *jobReports) evalDerivations() []wire.DiscoveredDerivation {
	var out []wire.DiscoveredDerivation
	for _, u := range r.updates {
		if e, ok := u.(*wire.JobUpdateEvalResult); ok {
			out = append(out, e.Derivations...)
		}
	}
	return out
}

func (l *scriptedLoop) wait(t *testing.T, jobID string, timeout time.Duration) *jobReports {
	t.Helper()
	out := &jobReports{}
	deadline := time.After(timeout)
	for {
		select {
		case <-deadline:
			t.Fatalf("job %s did not end within %s; updates so far: %d", jobID, timeout, len(out.updates))
		case r := <-l.reports:
			switch m := r.msg.(type) {
			case *wire.JobUpdate:
				if m.JobID == jobID {
					out.updates = append(out.updates, m.Update)
				}
			case *wire.LogChunk:
				if m.JobID == jobID {
					out.logs.Write(m.Data)
				}
			case *wire.EvalMessage:
				if m.JobID == jobID {
					out.evalMsg = append(out.evalMsg, m)
				}
			case *wire.JobCompleted:
				if m.JobID == jobID {
					return out
				}
			case *wire.JobFailed:
				if m.JobID == jobID {
					out.failed = m
					return out
				}
			}
		}
	}
}

type testWorld struct {
	loop    *scriptedLoop
	db      *storage.DB
	url     string
	project storage.Project
	keys    *narsig.Keys // the cache's: workers trust what it signs
}

func startServer(t *testing.T) *testWorld {
	t.Helper()
	db := testworld.Open(t, storagetest.SQLiteURL(t))
	loop := newScriptedLoop()
	url, _ := testworld.Serve(t, db, server.Config{Jobs: loop})
	project, cache := testworld.Project(t, db, "https://example.invalid/web.git")
	loop.project = project.ID
	keys, err := narsig.ParseKeys(cache.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	return &testWorld{loop: loop, db: db, url: url, project: project, keys: keys}
}

// startWorker runs a registered worker with its own Nix store; allowLocal
// is its --allow-local-repositories (the tests' flakes are in local
// repositories).
func (tw *testWorld) startWorker(t *testing.T, caps wire.GradientCapabilities, allowLocal bool) (string, *nix.Nix) {
	t.Helper()
	n := nixtest.New(t)
	n.TrustedKeys = tw.keys
	id, peers := testworld.Register(t, tw.db, tw.project.ID)
	testworld.RunWorker(t, worker.Config{
		Session: workersession.Config{
			ServerURL: tw.url, WorkerID: id, Peers: peers,
			Capabilities: caps, Heartbeat: time.Hour,
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		},
		CPUCoreScore: 1,
		Executor:     &nixexec.Executor{Nix: n, Logger: slog.New(slog.DiscardHandler), AllowLocalRepositories: allowLocal},
		TempDir:      t.TempDir(),
	})
	return id, n
}

func buildJob(id string, drv wire.DiscoveredDerivation, timeout, maxSilent *uint64) *wire.AssignJob {
	return &wire.AssignJob{JobID: id, AssignmentID: id + "-a1", Job: &wire.BuildJob{
		Builds: []wire.BuildSpec{{BuildID: "build-" + id, DrvPath: drv.DrvPath, Kind: wire.BuildSpecBuild,
			Outputs: drv.Outputs, TimeoutSecs: timeout, MaxSilentSecs: maxSilent}},
		Requirement: wire.BuildRequirement{Architecture: drv.Architecture, RequiredFeatures: []string{}},
	}}
}

func ptr[T any](v T) *T { return &v }

// TestFlakeFetchEvaluateBuild runs the whole job path with real Nix and
// the real server: one worker fetches and evaluates a flake and builds a
// leaf; a second worker, with an empty store, builds a dependent from
// what the first put into the cache; timeouts, failures and aborts end
// as their kinds.
func TestFlakeFetchEvaluateBuild(t *testing.T) {
	tw := startServer(t)
	all := wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}
	first, firstNix := tw.startWorker(t, all, true)
	second, secondNix := tw.startWorker(t, wire.GradientCapabilities{Build: true}, true)
	repo, commit := nixtest.Repo(t, map[string]string{"flake.nix": testFlake})

	tw.loop.enqueue(first, &wire.AssignJob{JobID: "eval", AssignmentID: "eval-a1", Job: &wire.FlakeJob{
		Steps:  []wire.FlakeStep{wire.FlakeStepFetchFlake, wire.FlakeStepEvaluateFlake, wire.FlakeStepEvaluateDerivations},
		Source: &wire.FlakeSourceRepository{URL: repo, Commit: commit}, Wildcards: []string{"packages.x86_64-linux.*", "packages.x86_64-linux.missing"},
		InputOverrides: []wire.FlakeInputOverride{},
	}})
	eval := tw.loop.wait(t, "eval", 3*time.Minute)
	if eval.failed != nil {
		t.Fatalf("evaluation failed: %s (%d)", eval.failed.Error, eval.failed.Kind)
	}
	var source string
	for _, u := range eval.updates {
		if fr, ok := u.(*wire.JobUpdateFetchResult); ok && fr.FlakeSource != nil {
			source = *fr.FlakeSource
		}
	}
	if !strings.HasPrefix(source, "/nix/store/") {
		t.Fatalf("no FetchResult with the flake source; updates %v", eval.updates)
	}
	drvs := map[string]wire.DiscoveredDerivation{}
	for _, d := range eval.evalDerivations() {
		drvs[d.Attr] = d
	}
	for _, attr := range []string{"hello", "greet", "broken", "sleepy", "silent"} {
		d, ok := drvs["packages.x86_64-linux."+attr]
		if !ok || !strings.HasSuffix(d.DrvPath, ".drv") || d.Architecture != "x86_64-linux" || len(d.Outputs) != 1 {
			t.Fatalf("derivation %s not reported properly: %+v", attr, d)
		}
	}
	hello, greet := drvs["packages.x86_64-linux.hello"], drvs["packages.x86_64-linux.greet"]
	if !slices.Equal(greet.Dependencies, []string{hello.DrvPath}) {
		t.Errorf("greet's dependencies %v, want [%s]", greet.Dependencies, hello.DrvPath)
	}
	last := eval.updates[len(eval.updates)-1].(*wire.JobUpdateEvalResult)
	if !slices.Equal(last.Errors, []string{"target 'packages.x86_64-linux.missing' matched no derivations in the flake"}) {
		t.Errorf("final EvalResult errors %q", last.Errors)
	}

	// The leaf on the first worker.
	tw.loop.enqueue(first, buildJob("hello", hello, nil, nil))
	if r := tw.loop.wait(t, "hello", 2*time.Minute); r.failed != nil {
		t.Fatalf("hello failed: %s", r.failed.Error)
	} else if !strings.Contains(r.logs.String(), "building hello") {
		t.Errorf("hello's log %q lacks the builder's output", r.logs.String())
	}

	// The dependent on the second worker: everything it needs comes from
	// the cache (the .drv closure and hello's output).
	tw.loop.enqueue(second, buildJob("greet", greet, nil, nil))
	r := tw.loop.wait(t, "greet", 2*time.Minute)
	if r.failed != nil {
		t.Fatalf("greet failed on the second worker: %s (kind %d, missing %v)", r.failed.Error, r.failed.Kind, r.failed.MissingPaths)
	}
	if _, ok := r.updates[0].(*wire.JobUpdateBuilding); !ok {
		t.Errorf("first update %T, want Building", r.updates[0])
	}
	var out *wire.JobUpdateBuildOutput
	for _, u := range r.updates {
		if o, ok := u.(*wire.JobUpdateBuildOutput); ok {
			out = o
		}
	}
	if out == nil || len(out.Outputs) != 1 || out.Outputs[0].StorePath != greet.Outputs[0].Path || out.Outputs[0].NarHash == nil {
		t.Fatalf("BuildOutput %+v, want greet's output %s", out, greet.Outputs[0].Path)
	}
	content, err := os.ReadFile(filepath.Join(secondNix.Store, greet.Outputs[0].Path))
	if err != nil || string(content) != "hello world\n" {
		t.Errorf("greet's output on the second worker: %q, %v", content, err)
	}

	// Failures, on the first worker.
	t.Run("failing builder", func(t *testing.T) {
		tw.loop.enqueue(first, buildJob("broken", drvs["packages.x86_64-linux.broken"], nil, nil))
		r := tw.loop.wait(t, "broken", time.Minute)
		if r.failed == nil || r.failed.Kind != wire.FailurePermanent {
			t.Fatalf("broken: %+v, want a Permanent failure", r.failed)
		}
		if !strings.Contains(r.logs.String(), "oops-this-fails") {
			t.Errorf("the failing build's log %q was not delivered", r.logs.String())
		}
	})
	t.Run("timeout", func(t *testing.T) {
		tw.loop.enqueue(first, buildJob("sleepy", drvs["packages.x86_64-linux.sleepy"], ptr[uint64](2), nil))
		r := tw.loop.wait(t, "sleepy", time.Minute)
		if r.failed == nil || r.failed.Kind != wire.FailureTimeout {
			t.Fatalf("sleepy past timeout_secs: %+v, want Timeout", r.failed)
		}
	})
	t.Run("max silent", func(t *testing.T) {
		tw.loop.enqueue(first, buildJob("silent", drvs["packages.x86_64-linux.silent"], nil, ptr[uint64](2)))
		r := tw.loop.wait(t, "silent", time.Minute)
		if r.failed == nil || r.failed.Kind != wire.FailureTimeout {
			t.Fatalf("silent past max_silent_secs: %+v, want Timeout", r.failed)
		}
	})
	t.Run("abort", func(t *testing.T) {
		job := buildJob("sleepy-abort", drvs["packages.x86_64-linux.sleepy"], nil, nil)
		tw.loop.enqueue(first, job)
		// Wait for the builder to run, then abort.
		deadline := time.After(time.Minute)
		for running := false; !running; {
			select {
			case rep := <-tw.loop.reports:
				if lc, ok := rep.msg.(*wire.LogChunk); ok && lc.JobID == "sleepy-abort" && bytes.Contains(lc.Data, []byte("still sleeping")) {
					running = true
				}
			case <-deadline:
				t.Fatal("the build never started")
			}
		}
		tw.loop.send(first, &wire.AbortJob{JobID: "sleepy-abort", Reason: "test"})
		r := tw.loop.wait(t, "sleepy-abort", time.Minute)
		if r.failed == nil || r.failed.Kind != wire.FailureAborted {
			t.Fatalf("aborted build: %+v, want Aborted", r.failed)
		}
	})
	t.Run("daemon dies", func(t *testing.T) {
		tw.loop.enqueue(first, buildJob("sleepy-daemon", drvs["packages.x86_64-linux.sleepy"], nil, nil))
		waitForLog(t, tw.loop, "sleepy-daemon", "still sleeping")
		// Every daemon of the worker's store goes: the one building and
		// the idle ones in its pool.
		if killed := killDaemons(t, firstNix.Store); killed == 0 {
			t.Fatal("no nix-daemon of the worker's store found")
		}
		r := tw.loop.wait(t, "sleepy-daemon", time.Minute)
		if r.failed == nil || r.failed.Kind != wire.FailureTransient {
			t.Fatalf("build whose daemon died: %+v, want Transient", r.failed)
		}
		// The worker connects to a new daemon for its next job.
		tw.loop.enqueue(first, buildJob("greet-after", greet, nil, nil))
		if r := tw.loop.wait(t, "greet-after", time.Minute); r.failed != nil {
			t.Fatalf("the job after the daemon died failed: %s (kind %d)", r.failed.Error, r.failed.Kind)
		}
		content, err := os.ReadFile(filepath.Join(firstNix.Store, greet.Outputs[0].Path))
		if err != nil || string(content) != "hello world\n" {
			t.Errorf("greet's output after the daemon came back: %q, %v", content, err)
		}
	})
}

// waitForLog waits for a line of a job's build log.
func waitForLog(t *testing.T, loop *scriptedLoop, jobID, text string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case rep := <-loop.reports:
			if lc, ok := rep.msg.(*wire.LogChunk); ok && lc.JobID == jobID && bytes.Contains(lc.Data, []byte(text)) {
				return
			}
		case <-deadline:
			t.Fatalf("job %s never logged %q", jobID, text)
		}
	}
}

// killDaemons kills the `nix-daemon --stdio --store store` processes
// (this test's own children) and returns how many there were. The builds
// they ran go too: an orphaned builder (without a sandbox nothing else
// ends it) would run on for the rest of the test run.
func killDaemons(t *testing.T, store string) int {
	t.Helper()
	want := "--stdio\x00--store\x00" + store + "\x00"
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	parents := map[int]int{}
	var daemons []int
	for _, f := range procs {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(filepath.Dir(f), "stat")); err == nil {
			// pid (comm) state ppid …: comm may hold spaces, so read after the last ')'.
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				if fields := strings.Fields(string(stat[i+1:])); len(fields) > 1 {
					parents[pid], _ = strconv.Atoi(fields[1])
				}
			}
		}
		cmdline, err := os.ReadFile(f)
		if err != nil || !bytes.HasPrefix(cmdline, []byte("nix-daemon\x00")) && !bytes.Contains(cmdline, []byte("/nix-daemon\x00")) ||
			!bytes.HasSuffix(cmdline, []byte(want)) {
			continue
		}
		daemons = append(daemons, pid)
	}
	doomed := map[int]bool{}
	for _, pid := range daemons {
		doomed[pid] = true
	}
	for grew := true; grew; { // the daemons' descendants: their builders
		grew = false
		for pid, ppid := range parents {
			if doomed[ppid] && !doomed[pid] {
				doomed[pid], grew = true, true
			}
		}
	}
	// The daemons first: a builder killed before its daemon would be
	// reported as a build killed by signal 9, not as the daemon going
	// away. Their builders after, so none is left orphaned.
	for _, pid := range daemons {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for pid := range doomed {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(daemons)
}
