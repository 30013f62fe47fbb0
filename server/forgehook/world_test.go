package forgehook_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/metrics"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forge/forgetest"
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

const adminToken = "forge-test-admin-token"

// testFlake: a package that builds and one that fails.
const testFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
  in {
    packages.${system}.greeting = step "greeting" "echo hello > $out";
    checks.${system}.broken = step "broken" "echo about to fail; exit 1";
  };
}
`

// world is a real server with its job loop over a real database, a
// project "ops/demo" of a local flake repository linked to a fake forge
// with a webhook secret, and (on demand) real workers on real Nix.
type world struct {
	t       *testing.T
	db      *storage.DB
	sched   *scheduler.Scheduler
	url     string // the server's /proto
	httpURL string
	project storage.Project
	repo    string
	commit  string
	forge   *forgetest.Server
	kind    forge.Kind
	secret  []byte
	metrics *prometheus.Registry
}

type worldOptions struct {
	dbURL        string
	authFailures int    // per minute; 0: the default
	trust        string // "" approve
	wildcards    []string
}

func newWorld(t *testing.T, kind forge.Kind, opt worldOptions) *world {
	t.Helper()
	if opt.dbURL == "" {
		opt.dbURL = storagetest.SQLiteURL(t)
	}
	db := testworld.Open(t, opt.dbURL)
	reg := metrics.NewRegistry()
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	log, _ := testlog.New(t, "server")
	sched := scheduler.New(db, scheduler.Config{Metrics: reg, Logger: log, Tick: 200 * time.Millisecond})
	if err := sched.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Close)
	sum := sha256.Sum256([]byte(adminToken))
	w := &world{t: t, db: db, sched: sched, kind: kind, metrics: reg}
	w.url, w.httpURL = testworld.Serve(t, db, server.Config{
		Jobs: sched, Metrics: reg, DialKey: box, AdminTokenHash: hex.EncodeToString(sum[:]), Logger: log,
		AuthFailuresPerMinute: opt.authFailures, ExternalURL: "https://ci.example.com",
		ForgeStatusInterval: 100 * time.Millisecond, ForgeStatusMinBackoff: 200 * time.Millisecond,
		AllowLocalRepositories: true,
	})
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": testFlake})
	w.project, _ = testworld.Project(t, db, w.repo)
	if opt.wildcards != nil {
		if err := db.UpdateProjectWildcards(t.Context(), w.project.ID, opt.wildcards); err != nil {
			t.Fatal(err)
		}
		w.project.Wildcards = opt.wildcards
	}
	w.forge = forgetest.New(t, kind, forgetest.Options{Permissions: map[string]string{"maintainer": "write", "reader": "read"}})
	link := w.forge.Link()
	var view admin.ForgeView
	w.api("PUT", "/api/v1/projects/ops%2Fdemo/forge", admin.ForgeRequest{
		Kind: string(kind), APIURL: link.APIURL, Repository: link.Repository, Token: link.Token, Trust: opt.trust,
	}, http.StatusOK, &view)
	if view.Credential != "token" || view.Repository != link.Repository || view.WebhookSecretSet {
		t.Fatalf("forge link %+v", view)
	}
	var secret admin.WebhookSecretView
	w.api("POST", "/api/v1/projects/ops%2Fdemo/forge/webhook-secret", nil, http.StatusOK, &secret)
	if want := "https://ci.example.com/api/v1/forge/" + string(kind) + "/ops/demo"; secret.WebhookURL != want || len(secret.Secret) < 32 {
		t.Fatalf("webhook secret answer %+v, want URL %s", secret, want)
	}
	w.secret = []byte(secret.Secret)
	return w
}

// api calls the admin API and decodes the answer into out.
func (w *world) api(method, path string, body any, want int, out any) []byte {
	w.t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			w.t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(w.t.Context(), method, w.httpURL+path, r)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		w.t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, got, want)
	}
	if out != nil {
		if err := json.Unmarshal(got, out); err != nil {
			w.t.Fatalf("%s %s: %v: %s", method, path, err, got)
		}
	}
	return got
}

// deliver posts a delivery to the project's webhook and returns the
// answer's status.
func (w *world) deliver(h http.Header, body []byte) int {
	w.t.Helper()
	return w.deliverTo("/api/v1/forge/"+string(w.kind)+"/ops/demo", h, body)
}

func (w *world) deliverTo(path string, h http.Header, body []byte) int {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.t.Context(), "POST", w.httpURL+path, bytes.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if took := time.Since(start); took > 5*time.Second {
		w.t.Errorf("the webhook answered after %s", took)
	}
	return resp.StatusCode
}

// evaluations lists the project's evaluations, oldest first.
func (w *world) evaluations() []storage.Evaluation {
	w.t.Helper()
	list, err := jobqueue.New(w.db).ListEvaluations(w.t.Context(), w.project.ID, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	for i, j := 0, len(list)-1; i < j; i, j = i+1, j-1 {
		list[i], list[j] = list[j], list[i]
	}
	return list
}

// context is the project's status context.
func (w *world) context() string { return "gradient/demo" }

// states are the states the fake received for (commit, context).
func (w *world) states(commit, context string) []string {
	var out []string
	for _, r := range w.forge.Statuses(commit, context) {
		out = append(out, r.State)
	}
	return out
}

// startWorker runs a worker with every capability and its own store.
func (w *world) startWorker() {
	id, peers := testworld.Register(w.t, w.db, w.project.ID)
	testworld.RunWorker(w.t, worker.Config{
		Session: workersession.Config{
			ServerURL: w.url, WorkerID: id, Peers: peers,
			Capabilities: wire.GradientCapabilities{Fetch: true, Eval: true, Build: true},
			Heartbeat:    2 * time.Second, BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		},
		CPUCoreScore: 1,
		Executor:     &nixexec.Executor{Nix: nixtest.New(w.t), Logger: slog.New(slog.DiscardHandler), AllowLocalRepositories: true},
		TempDir:      w.t.TempDir(),
	})
}

// commitFile commits a change to the repository's branch and returns the
// commit.
func (w *world) commitFile(name, content string) string {
	w.t.Helper()
	if err := os.WriteFile(w.repo+"/"+name, []byte(content), 0o644); err != nil {
		w.t.Fatal(err)
	}
	nixtest.Git(w.t, w.repo, "add", name)
	nixtest.Git(w.t, w.repo, "commit", "--quiet", "-m", "change "+name)
	return nixtest.Git(w.t, w.repo, "rev-parse", "HEAD")
}

// pullRequestHead makes a commit reachable only from the pull request's
// ref, as a fork's head is on the forge, and returns it.
func (w *world) pullRequestHead(number int, name, content string) string {
	w.t.Helper()
	branch := "tmp-pr"
	nixtest.Git(w.t, w.repo, "switch", "--quiet", "-c", branch)
	head := w.commitFile(name, content)
	nixtest.Git(w.t, w.repo, "switch", "--quiet", "master")
	nixtest.Git(w.t, w.repo, "update-ref", forge.PullRef(w.kind, number), head)
	nixtest.Git(w.t, w.repo, "branch", "--quiet", "-D", branch)
	return head
}
