package nixexec_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

// drainFlake's builds: one that ends by itself a few seconds after it
// starts, one that never does.
const drainFlake = `{
  outputs = { self }: let
    sys = "x86_64-linux";
    mk = name: script: builtins.derivation {
      inherit name; system = sys; builder = "/bin/sh"; args = [ "-c" script ];
    };
  in {
    packages.${sys} = {
      finishes = mk "finishes" "echo started; /bin/sleep 3; echo finished > $out";
      outlasts = mk "outlasts" "echo started; while true; do echo still building; /bin/sleep 1; done";
    };
  };
}
`

// The worker's stop (Run's ctx ending, as on SIGTERM) with a real Nix
// build running: within the drain budget the build finishes and reports
// JobCompleted; a build that outlasts a short budget is aborted and
// reported Canceled. Either way Run returns.
func TestStopDrainsRunningBuild(t *testing.T) {
	tw := startServer(t)
	repo, commit := nixtest.Repo(t, map[string]string{"flake.nix": drainFlake})
	flakeRef := "git+file://" + repo + "?rev=" + commit
	for _, c := range []struct {
		name, attr string
		drain      time.Duration
		completed  bool
	}{
		{"the build finishes within the drain timeout", "finishes", time.Hour, true},
		{"the build outlasts the drain timeout", "outlasts", time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := nixtest.New(t)
			drvPath, err := n.Instantiate(t.Context(), flakeRef, "packages.x86_64-linux."+c.attr)
			if err != nil {
				t.Fatal(err)
			}
			d, err := n.Derivation(t.Context(), drvPath)
			if err != nil {
				t.Fatal(err)
			}
			drv := wire.DiscoveredDerivation{DrvPath: drvPath, Architecture: d.System,
				Outputs: []wire.DerivationOutput{{Name: "out", Path: d.Outputs["out"].Path}}}
			id, peers := testworld.Register(t, tw.db, tw.project.ID)
			w, err := worker.New(worker.Config{
				Session: workersession.Config{
					ServerURL: tw.url, WorkerID: id, Peers: peers,
					Capabilities: wire.GradientCapabilities{Build: true}, Heartbeat: time.Hour,
					BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
					Logger: slog.New(slog.DiscardHandler),
				},
				CPUCoreScore: 1,
				Executor:     &nixexec.Executor{Nix: n, Logger: slog.New(slog.DiscardHandler)},
				TempDir:      t.TempDir(),
				DrainTimeout: c.drain,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()

			jobID := "drain-" + c.attr
			tw.loop.enqueue(id, buildJob(jobID, drv, nil, nil))
			waitForLog(t, tw.loop, jobID, "started")
			stop() // SIGTERM
			r := tw.loop.wait(t, jobID, time.Minute)
			switch {
			case c.completed && r.failed != nil:
				t.Fatalf("the build failed while draining: %s (kind %d), want it completed", r.failed.Error, r.failed.Kind)
			case !c.completed && (r.failed == nil || r.failed.Kind != wire.FailureCanceled):
				t.Fatalf("the build past the drain timeout: %+v, want Canceled", r.failed)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("Run did not return after the stop")
			}
		})
	}
}
