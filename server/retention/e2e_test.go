package retention_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

// gcFlake's outputs reference each other: app → lib → base, app → data.
// base is the same derivation in every version (one path all
// evaluations share); data-<v> differs by name only, so every version's
// NAR is the same object in the NAR store.
func gcFlake(version int) string {
	return fmt.Sprintf(`{
  outputs = { self }: let
    system = "x86_64-linux";
    v = "%d";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
  in rec {
    packages.${system} = rec {
      base = step "base" "echo base > $out";
      data = step "data-${v}" "echo the same data in every version > $out";
      lib = step "lib-${v}" "echo lib ${v} ${base} > $out";
      app = step "app-${v}" "echo app ${v} ${lib} ${data} > $out";
    };
  };
}
`, version)
}

// The end-to-end test: three evaluations of a flake built by real
// workers, a project keeping two; after a collection the kept
// evaluations' outputs copy with their closures into a real Nix store
// with signatures checked, the dropped evaluation's own paths answer 404,
// the path and the NAR object the kept ones share survive, and the dry
// run listed exactly what the run deleted. On both engines.
func TestCollectionEndToEndWithRealNix(t *testing.T) {
	nixtest.Require(t, "nix", "git")
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		db := testworld.Open(t, dbURL)
		sched := scheduler.New(db, scheduler.Config{Logger: slog.New(slog.DiscardHandler), Tick: 200 * time.Millisecond})
		if err := sched.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sched.Close)
		const token = "gc-e2e-admin-token"
		sum := sha256.Sum256([]byte(token))
		wsURL, httpURL := testworld.Serve(t, db, server.Config{Jobs: sched, AdminTokenHash: hex.EncodeToString(sum[:]), GCGrace: time.Millisecond})
		repo, _ := nixtest.Repo(t, map[string]string{"flake.nix": gcFlake(1)})
		project, cache := testworld.Project(t, db, repo)
		for range 2 {
			id, peers := testworld.Register(t, db, project.ID)
			testworld.RunWorker(t, worker.Config{
				Session: workersession.Config{
					ServerURL: wsURL, WorkerID: id, Peers: peers,
					Capabilities: wire.GradientCapabilities{Fetch: true, Eval: true, Build: true},
					Heartbeat:    2 * time.Second, BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
				},
				CPUCoreScore: 1,
				Executor: &nixexec.Executor{Nix: nixtest.Trusting(t, cache.PublicKey()), Logger: slog.New(slog.DiscardHandler),
					AllowLocalRepositories: true},
				TempDir: t.TempDir(),
			})
		}

		// outputs[v]["app"] is version v's app output.
		outputs := map[int]map[string]string{}
		for v := 1; v <= 3; v++ {
			if err := os.WriteFile(filepath.Join(repo, "flake.nix"), []byte(gcFlake(v)), 0o644); err != nil {
				t.Fatal(err)
			}
			nixtest.Git(t, repo, "commit", "--quiet", "--allow-empty", "-am", fmt.Sprint("v", v))
			commit := nixtest.Git(t, repo, "rev-parse", "HEAD")
			ev, err := sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: project.ID, RepositoryURL: repo,
				Commit: commit, Wildcards: []string{"packages.x86_64-linux.*"}})
			if err != nil {
				t.Fatal(err)
			}
			ev, builds := testworld.WaitForEvaluation(t, db, ev.ID, "the end", 3*time.Minute,
				func(ev storage.Evaluation, _ []storage.Build) bool { return ev.Status.Terminal() })
			if ev.Status != storage.EvaluationSucceeded {
				t.Fatalf("evaluation %d: %s (%s)", v, ev.Status, ev.Error)
			}
			outputs[v] = map[string]string{}
			for _, b := range builds {
				if len(b.OutputInfo) != 1 {
					t.Fatalf("build %s: %+v", b.Attr, b)
				}
				outputs[v][b.Attr[strings.LastIndex(b.Attr, ".")+1:]] = b.OutputInfo[0].StorePath
			}
			time.Sleep(5 * time.Millisecond) // distinct creation times
		}
		if outputs[1]["base"] != outputs[3]["base"] || outputs[1]["data"] == outputs[3]["data"] {
			t.Fatalf("the flake does not share what the test needs: %v", outputs)
		}
		keep := 2
		if err := db.SetProjectKeepEvaluations(t.Context(), project.ID, &keep); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // past the grace period

		gc := func(dry bool) retention.Report {
			t.Helper()
			req, _ := http.NewRequestWithContext(t.Context(), "POST", fmt.Sprintf("%s/api/v1/gc?dry_run=%v", httpURL, dry), nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var rep retention.Report
			if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != 200 {
				t.Fatalf("POST /api/v1/gc: %d, %v", resp.StatusCode, err)
			}
			return rep
		}
		dry := gc(true)
		rep := gc(false)
		if !slices.Equal(sorted(pathsOf(dry)), sorted(pathsOf(rep))) || !slices.Equal(sorted(dry.Objects), sorted(rep.Objects)) {
			t.Errorf("the dry run listed %v and objects %v; the run deleted %v and objects %v",
				pathsOf(dry), dry.Objects, pathsOf(rep), rep.Objects)
		}
		if rep.ObjectsFreed < 2 {
			t.Errorf("freed objects %v; want at least the dropped app's and lib's", rep.Objects)
		}
		deleted := map[string]bool{}
		for _, p := range pathsOf(rep) {
			deleted[p] = true
		}
		for _, name := range []string{"app", "lib", "data"} {
			if !deleted[outputs[1][name]] {
				t.Errorf("the dropped evaluation's %s %s was not deleted (deleted %v)", name, outputs[1][name], pathsOf(rep))
			}
		}

		narinfo := func(path string) int {
			t.Helper()
			hash := strings.TrimPrefix(path, storage.StoreDir+"/")[:32]
			resp, err := http.Get(httpURL + "/cache/main/" + hash + ".narinfo")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		for _, name := range []string{"app", "lib", "data"} {
			if code := narinfo(outputs[1][name]); code != http.StatusNotFound {
				t.Errorf("the dropped %s answers %d, want 404", name, code)
			}
		}
		// The kept evaluations' outputs and closures, into an empty store,
		// signatures checked against the cache's key.
		for _, v := range []int{2, 3} {
			client := nixtest.New(t)
			if err := client.CopyFrom(t.Context(), httpURL+"/cache/main", []string{cache.PublicKey()}, outputs[v]["app"]); err != nil {
				t.Fatalf("nix copy of version %d's app: %v", v, err)
			}
			for _, name := range []string{"app", "lib", "base", "data"} {
				content, err := os.ReadFile(filepath.Join(client.Store, outputs[v][name]))
				if err != nil {
					t.Errorf("version %d's %s is not in the copied closure: %v", v, name, err)
				} else if name == "data" && !strings.Contains(string(content), "the same data") {
					t.Errorf("version %d's data (a NAR object shared with the dropped version) reads %q", v, content)
				}
			}
		}
		// A second run finds nothing more to free.
		if again := gc(false); again.PathsFreed != 0 || again.ObjectsFreed != 0 {
			t.Errorf("a second collection freed %v and %v", pathsOf(again), again.Objects)
		}
	})
}
