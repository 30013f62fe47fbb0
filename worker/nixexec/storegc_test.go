package nixexec_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

// gcFlake: lone is referenced by nothing; slow uses hello's output and
// waits for the file %[1]s before finishing.
const gcFlake = `{
  outputs = { self }: let
    sys = "x86_64-linux";
    mk = name: script: builtins.derivation {
      inherit name; system = sys; builder = "/bin/sh"; args = [ "-c" script ];
    };
  in {
    packages.${sys} = rec {
      hello = mk "hello-1.0" "echo hello > $out";
      lone = mk "lone" "echo lone > $out";
      greet = mk "greet" "read x < ${hello}; echo \"$x world\" > $out";
      slow = mk "slow" "read x < ${hello}; echo waiting; while [ ! -e %[1]s ]; do /bin/sleep 0.1; done; echo \"$x slow\" > $out";
    };
  };
}
`

// A worker whose min-free is above the free space of its store's file
// system collects after each job: what earlier jobs built and no job
// holds any more leaves the store; a collection while a build runs
// leaves that build's inputs, and the build completes; the worker builds
// again afterwards.
func TestStoreGCBetweenJobsKeepsRunningJobsPaths(t *testing.T) {
	tw := startServer(t)
	n := nixtest.New(t)
	n.TrustedKeys = tw.keys
	// A chroot store's builders see only the sandbox paths: let slow see
	// its flag.
	flagDir := t.TempDir()
	flag := filepath.Join(flagDir, "go")
	n.Config = append(slices.Clone(n.Config), "extra-sandbox-paths = "+flagDir)
	dir, err := n.RealStoreDir(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(n.Store, "nix/store"); dir != want {
		t.Fatalf("RealStoreDir %s, want the chroot store's %s", dir, want)
	}
	gc, err := nixexec.NewStoreGC(nixexec.StoreGCConfig{Store: n, Dir: dir, MinFree: 1 << 62, Interval: time.Hour,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go gc.Run(ctx)
	id, peers := testworld.Register(t, tw.db, tw.project.ID)
	testworld.RunWorker(t, worker.Config{
		Session: workersession.Config{
			ServerURL: tw.url, WorkerID: id, Peers: peers,
			Capabilities: wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}, Heartbeat: time.Hour,
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		},
		CPUCoreScore: 1,
		Executor: &nixexec.Executor{Nix: n, Logger: slog.New(slog.DiscardHandler), AllowLocalRepositories: true,
			GCRootsDir: filepath.Join(t.TempDir(), "gcroots"), GC: gc},
		TempDir: t.TempDir(),
	})
	repo, commit := nixtest.Repo(t, map[string]string{"flake.nix": fmt.Sprintf(gcFlake, flag)})
	onDisk := func(p string) bool {
		_, err := os.Lstat(filepath.Join(n.Store, p))
		return err == nil
	}

	tw.loop.enqueue(id, &wire.AssignJob{JobID: "eval", AssignmentID: "eval-a1", Job: &wire.FlakeJob{
		Steps:  []wire.FlakeStep{wire.FlakeStepFetchFlake, wire.FlakeStepEvaluateFlake, wire.FlakeStepEvaluateDerivations},
		Source: &wire.FlakeSourceRepository{URL: repo, Commit: commit}, Wildcards: []string{"packages.x86_64-linux.*"},
		InputOverrides: []wire.FlakeInputOverride{},
	}})
	eval := tw.loop.wait(t, "eval", 3*time.Minute)
	if eval.failed != nil {
		t.Fatalf("evaluation failed: %s", eval.failed.Error)
	}
	drvs := map[string]wire.DiscoveredDerivation{}
	for _, d := range eval.evalDerivations() {
		drvs[strings.TrimPrefix(d.Attr, "packages.x86_64-linux.")] = d
	}
	build := func(name string) {
		t.Helper()
		tw.loop.enqueue(id, buildJob(name, drvs[name], nil, nil))
		if r := tw.loop.wait(t, name, 2*time.Minute); r.failed != nil {
			t.Fatalf("%s failed: %s (kind %d, missing %v)", name, r.failed.Error, r.failed.Kind, r.failed.MissingPaths)
		}
	}

	// Built, uploaded, released: dead, and collected after the job.
	build("lone")
	lone := drvs["lone"].Outputs[0].Path
	waitfor.True(t, "the collection after the job to delete lone's output", func() bool { return !onDisk(lone) })
	build("hello")
	hello := drvs["hello"].Outputs[0].Path
	waitfor.True(t, "the collection after the job to delete hello's output", func() bool { return !onDisk(hello) })

	// slow pulls hello's output back from the cache and builds; while it
	// waits, a collection runs, with a dead path to delete.
	tw.loop.enqueue(id, buildJob("slow", drvs["slow"], nil, nil))
	waitForLog(t, tw.loop, "slow", "waiting")
	dead := addDeadPath(t, n.Store, n.Env)
	res := gc.Check(ctx)
	if onDisk(dead) || res.Paths == 0 {
		t.Errorf("the collection during the build left the dead path %s (result %+v)", dead, res)
	}
	for _, p := range []string{hello, drvs["slow"].DrvPath} {
		if !onDisk(p) {
			t.Errorf("the collection deleted %s, which the running build holds", p)
		}
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := tw.loop.wait(t, "slow", 2*time.Minute); r.failed != nil {
		t.Fatalf("the build running during the collection failed: %s (kind %d)", r.failed.Error, r.failed.Kind)
	}

	// And the worker builds afterwards.
	build("greet")
	// Its output was collected after the job; the upload had it.
	greet := drvs["greet"].Outputs[0].Path
	waitfor.True(t, "greet's output collected after its job", func() bool { return !onDisk(greet) })
}

// addDeadPath adds a file to the store that nothing roots.
func addDeadPath(t *testing.T, store string, env []string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "dead-file")
	if err := os.WriteFile(f, []byte(fmt.Sprint("dead ", time.Now().UnixNano())), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nix-store", "--store", store, "--add", f)
	cmd.Env = append(append(os.Environ(), env...), "NIX_CONFIG="+strings.Join(nixtest.Config, "\n"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nix-store --add: %v", err)
	}
	return strings.TrimSpace(string(out))
}
