package scheduler_test

import (
	"path"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/authority/authoritytest"
	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// limitsFlake: a derivation that disables both limits, one that sets
// none and one with its own.
const limitsFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: extra: builtins.derivation ({
      inherit name system; builder = "/bin/sh"; args = [ "-c" "echo ${name} > $out" ];
    } // extra);
  in {
    packages.${system} = {
      unlimited = step "unlimited" { timeout = 0; maxSilent = 0; };
      plain = step "plain" {};
      own = step "own" { timeout = 5; maxSilent = 7; };
    };
  };
}
`

// The limits a real Nix evaluation finds reach the BuildSpec: a
// derivation's own 0 disables a limit whatever the server's default, a
// derivation without one gets the server's option, and a server option
// of 0 disables that limit (docs/protocol/connection.md, Build Timeouts).
func TestDerivationLimitsReachTheBuildSpec(t *testing.T) {
	for engine, dbURL := range map[string]func(testing.TB) string{"sqlite": storagetest.SQLiteURL, "postgres": storagetest.PostgresURL} {
		t.Run(engine, func(t *testing.T) { testLimitsReachTheBuildSpec(t, dbURL(t)) })
	}
}

func testLimitsReachTheBuildSpec(t *testing.T, dbURL string) {
	w := newWorldWith(t, dbURL, 0, scheduler.Config{DefaultTimeoutSecs: new(uint64(0)), DefaultMaxSilentSecs: new(uint64(1234))})
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": limitsFlake})
	w.startWorkerWith(wire.GradientCapabilities{Fetch: true, Eval: true})
	ev := w.evaluate("packages.x86_64-linux.*")
	w.waitFor(ev.ID, "three builds to wait for a builder", 2*time.Minute, func(ev storage.Evaluation, builds []storage.Build) bool {
		return ev.Status == storage.EvaluationBuilding && len(builds) == 3
	})

	sent := make(chan wire.ServerMessage, 64)
	builder := authoritytest.NewLiveWorker(storage.NewID(), map[string]authority.Abilities{w.project.ID: {Build: true}},
		wire.GradientCapabilities{Build: true}, &wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, SystemFeatures: []string{}},
		func(m wire.ServerMessage) error { sent <- m; return nil })
	w.sched.SessionStarted(builder)
	specs := map[string]wire.BuildSpec{}
	for len(specs) < 3 {
		w.sched.HandleJobMessage(builder, &wire.RequestJob{Kind: wire.JobKindBuild})
		select {
		case m := <-sent:
			if a, ok := m.(*wire.AssignJob); ok {
				spec := a.Job.(*wire.BuildJob).Builds[0]
				specs[drvName(spec.DrvPath)] = spec
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no AssignJob; have %v", specs)
		}
	}
	for name, want := range map[string][2]*uint64{
		"unlimited": {nil, nil},
		"plain":     {nil, new(uint64(1234))},
		"own":       {new(uint64(5)), new(uint64(7))},
	} {
		spec, ok := specs[name]
		if !ok {
			t.Fatalf("no BuildSpec for %s in %v", name, specs)
		}
		if !sameLimit(spec.TimeoutSecs, want[0]) || !sameLimit(spec.MaxSilentSecs, want[1]) {
			t.Errorf("%s: timeout %s, max silent %s; want %s and %s", name,
				showLimit(spec.TimeoutSecs), showLimit(spec.MaxSilentSecs), showLimit(want[0]), showLimit(want[1]))
		}
	}
}

func sameLimit(a, b *uint64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func showLimit(v *uint64) string {
	if v == nil {
		return "none"
	}
	return time.Duration(*v * uint64(time.Second)).String()
}

// drvName is the derivation name of a /nix/store/<hash>-<name>.drv path.
func drvName(drvPath string) string {
	base := strings.TrimSuffix(path.Base(drvPath), ".drv")
	return base[strings.IndexByte(base, '-')+1:]
}
