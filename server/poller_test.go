package server_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

func TestLsRemote(t *testing.T) {
	t.Parallel()
	repo := servertest.NewGitRepo(t)
	head := repo.Commit("one")
	ctx := t.Context()
	if got, err := server.LsRemote(ctx, repo.Dir, "main"); err != nil || got != head {
		t.Fatalf("lsRemote = %q, %v; want %s", got, err, head)
	}
	if got, err := server.LsRemote(ctx, "git+file://"+repo.Dir, "main"); err != nil || got != head {
		t.Fatalf("lsRemote(git+file://) = %q, %v; want %s", got, err, head)
	}
	// A branch whose name ends like another's is not mistaken for it.
	repo.Git("branch", "feature/main")
	if _, err := server.LsRemote(ctx, repo.Dir, "nope"); err == nil || !strings.Contains(err.Error(), "no such branch") {
		t.Fatalf("missing branch: %v", err)
	}
	if _, err := server.LsRemote(ctx, filepath.Join(t.TempDir(), "missing"), "main"); err == nil || strings.Contains(err.Error(), "no such branch") {
		t.Fatalf("missing repository: %v", err)
	}
	for _, bad := range [][2]string{{"--upload-pack=touch /tmp/x", "main"}, {repo.Dir, "--all"}, {repo.Dir, "ma*"}, {"", "main"}} {
		if _, err := server.LsRemote(ctx, bad[0], bad[1]); err == nil {
			t.Fatalf("lsRemote(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func TestPollerStartsEvaluationsOfNewHeads(t *testing.T) {
	t.Parallel()
	e, fake := servertest.NewEvalEnv(t, server.Config{AllowLocalRepositories: true})
	ctx := t.Context()
	repo := servertest.NewGitRepo(t)
	first := repo.Commit("first")
	web := servertest.NewProjectAt(t, e.DB, "ops", "web", repo.Dir, "main")
	broken := servertest.NewProjectAt(t, e.DB, "ops", "broken", filepath.Join(t.TempDir(), "gone.git"), "main")

	// No evaluation yet: the head is evaluated.
	started := e.Srv.PollBranches(ctx)
	if len(started) != 1 || started[0].ProjectID != web.ID || started[0].Commit != first {
		t.Fatalf("first poll started %+v", started)
	}
	evals := servertest.EvaluationsOf(t, e.DB, web.ID)
	if len(evals) != 1 || evals[0].Commit != first || evals[0].RepositoryURL != repo.Dir ||
		strings.Join(evals[0].Wildcards, ",") != "packages.x86_64-linux.*" {
		t.Fatalf("evaluations after the first poll: %+v", evals)
	}
	if !strings.Contains(e.Logs.String(), "branch poll: evaluation started") ||
		!strings.Contains(e.Logs.String(), "project=ops/web") {
		t.Fatalf("no info line for the started evaluation:\n%s", e.Logs.String())
	}

	// The unreachable repository is a warning naming the project.
	logs := e.Logs.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "project=ops/broken") {
		t.Fatalf("no warning for the unreachable repository:\n%s", logs)
	}
	if got := servertest.EvaluationsOf(t, e.DB, broken.ID); len(got) != 0 {
		t.Fatalf("unreachable repository got evaluations %+v", got)
	}

	// Unchanged head: nothing new.
	if started := e.Srv.PollBranches(ctx); len(started) != 0 {
		t.Fatalf("unchanged head started %+v", started)
	}

	// A new commit starts a second evaluation.
	second := repo.Commit("second")
	started = e.Srv.PollBranches(ctx)
	if len(started) != 1 || started[0].Commit != second {
		t.Fatalf("new head started %+v", started)
	}
	evals = servertest.EvaluationsOf(t, e.DB, web.ID)
	if len(evals) != 2 || evals[0].Commit != second || evals[1].Commit != first {
		t.Fatalf("evaluations after the new head: %+v", evals)
	}
	if started := e.Srv.PollBranches(ctx); len(started) != 0 {
		t.Fatalf("third poll started %+v", started)
	}
	if n := fake.StartedCount(); n != 2 {
		t.Fatalf("the job loop started %d evaluations, want 2", n)
	}
}

func TestPollerRunsOnItsInterval(t *testing.T) {
	t.Parallel()
	repo := servertest.NewGitRepo(t)
	head := repo.Commit("first")
	e, _ := servertest.NewEvalEnv(t, server.Config{PollInterval: 20 * time.Millisecond, AllowLocalRepositories: true})
	web := servertest.NewProjectAt(t, e.DB, "ops", "web", repo.Dir, "main")
	deadline := time.Now().Add(10 * time.Second)
	for len(servertest.EvaluationsOf(t, e.DB, web.ID)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the poller started no evaluation:\n%s", e.Logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	next := repo.Commit("second")
	for {
		evals := servertest.EvaluationsOf(t, e.DB, web.ID)
		if len(evals) >= 2 {
			if len(evals) != 2 || evals[0].Commit != next || evals[1].Commit != head {
				t.Fatalf("evaluations %+v", evals)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the poller missed the new head:\n%s", e.Logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Close waits for the poller (a leak would fail -race runs' cleanup).
	e.Srv.Close()
}

func TestPollerNeedsEvaluationControl(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnvWith(t, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken), PollInterval: time.Millisecond})
	if !strings.Contains(e.Logs.String(), "branch polling disabled") {
		t.Fatalf("no warning about the missing job loop:\n%s", e.Logs.String())
	}
	if started := e.Srv.PollBranches(t.Context()); started != nil {
		t.Fatalf("started %+v without a job loop", started)
	}
}

// A project's deploy key opens its SSH repository to the branch poll
// (the "ssh" serves it only to a caller presenting an OpenSSH key).
func TestPollerUsesDeployKey(t *testing.T) {
	t.Parallel()
	host := nixtest.NewSSHHost(t)
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	e, _ := servertest.NewEvalEnv(t, server.Config{SSH: host.Program, DialKey: box})
	repo := servertest.NewGitRepo(t)
	head := repo.Commit("first")
	p := servertest.NewProjectAt(t, e.DB, "ops", "private", "ssh://git.example.invalid"+repo.Dir, "main")

	if started := e.Srv.PollBranches(t.Context()); len(started) != 0 {
		t.Fatalf("a poll without the deploy key started %+v", started)
	}
	if !strings.Contains(e.Logs.String(), "Permission denied") {
		t.Fatalf("no warning with the host's refusal:\n%s", e.Logs.String())
	}
	var key admin.DeployKeyView
	e.Must(200, "POST", servertest.ProjectPath("ops/private")+"/deploy-key", nil, &key)
	started := e.Srv.PollBranches(t.Context())
	if len(started) != 1 || started[0].ProjectID != p.ID || started[0].Commit != head {
		t.Fatalf("a poll with the deploy key started %+v", started)
	}
	keyFiles, err := os.ReadFile(host.KeysUsed)
	if err != nil {
		t.Fatal(err)
	}
	for keyFile := range strings.Lines(string(keyFiles)) {
		if _, err := os.Stat(strings.TrimSpace(keyFile)); !os.IsNotExist(err) {
			t.Errorf("the deploy key file %s outlived the poll (%v)", keyFile, err)
		}
	}
	// The server may never have met the host: its key is not checked
	// (as the worker's fetch does), or a real ssh would refuse in batch mode.
	options, _ := os.ReadFile(host.Options)
	for _, want := range []string{"StrictHostKeyChecking=no", "IdentitiesOnly=yes", "BatchMode=yes"} {
		if !strings.Contains(string(options), want+"\n") {
			t.Errorf("ssh options %q lack %s", options, want)
		}
	}
	if strings.Contains(e.Logs.String(), "PRIVATE KEY") {
		t.Error("the private key appears in the server log")
	}
}

// A commit a push webhook evaluated is not evaluated again by the poller,
// and a pull request's evaluation (the newest) does not count as the
// branch's.
func TestPollerSkipsPushedCommitsAndIgnoresPullRequests(t *testing.T) {
	t.Parallel()
	e, _ := servertest.NewEvalEnv(t, server.Config{AllowLocalRepositories: true})
	ctx := t.Context()
	repo := servertest.NewGitRepo(t)
	head := repo.Commit("first")
	web := servertest.NewProjectAt(t, e.DB, "ops", "web", repo.Dir, "main")
	pushed := web.EvaluationAt(head)
	pushed.Source = storage.SourcePush
	if _, err := jobqueue.New(e.DB).CreateEvaluation(ctx, pushed); err != nil {
		t.Fatal(err)
	}
	pr := web.EvaluationAt("0123456789abcdef0123456789abcdef01234567")
	pr.Source, pr.PRNumber, pr.TargetBranch = storage.SourcePR, 4, "main"
	if _, err := jobqueue.New(e.DB).CreateEvaluation(ctx, pr); err != nil {
		t.Fatal(err)
	}
	if started := e.Srv.PollBranches(ctx); len(started) != 0 {
		t.Fatalf("the poller evaluated the pushed commit again: %+v", started)
	}
	second := repo.Commit("second")
	started := e.Srv.PollBranches(ctx)
	if len(started) != 1 || started[0].Commit != second || started[0].Source != storage.SourcePoll {
		t.Fatalf("new head started %+v", started)
	}
}

// TestPollerUsesProjectWildcards: the branch poller evaluates what the
// project says, not a fixed pattern. (Here, not with the admin API's
// tests: it runs the poll itself, which no API route does.)
func TestPollerUsesProjectWildcards(t *testing.T) {
	t.Parallel()
	e, _ := servertest.NewEvalEnv(t, server.Config{AllowLocalRepositories: true}) // the repository is a local one
	repo := servertest.NewGitRepo(t)
	head := repo.Commit("first")
	web := servertest.NewProjectAt(t, e.DB, "ops", "web", repo.Dir, "main")
	own := []string{"checks.x86_64-linux.*", "packages.*.*"}
	if err := e.DB.UpdateProjectWildcards(t.Context(), web.ID, own); err != nil {
		t.Fatal(err)
	}
	if started := e.Srv.PollBranches(t.Context()); len(started) != 1 || started[0].Commit != head {
		t.Fatalf("poll started %+v", started)
	}
	if evals := servertest.EvaluationsOf(t, e.DB, web.ID); len(evals) != 1 || !slices.Equal(evals[0].Wildcards, own) {
		t.Fatalf("the poller's evaluation: %+v, want wildcards %q", evals, own)
	}
}
