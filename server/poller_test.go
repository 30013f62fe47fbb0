package server

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

// fakeEvaluations is a job loop that starts and cancels evaluations in
// storage directly, as the scheduler does minus the workers.
type fakeEvaluations struct {
	mu        sync.Mutex
	db        *storage.DB // set once the test's database is open
	started   []storage.NewEvaluation
	cancelled []string
	progress  map[string]wire.BuildProgress // by build ID
}

func (f *fakeEvaluations) BuildProgress(buildID string) (wire.BuildProgress, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.progress[buildID]
	return p, ok
}

func (f *fakeEvaluations) SessionStarted(*authority.LiveWorker)                       {}
func (f *fakeEvaluations) HandleJobMessage(*authority.LiveWorker, wire.ClientMessage) {}
func (f *fakeEvaluations) SessionEnded(*authority.LiveWorker, string)                 {}

func (f *fakeEvaluations) StartEvaluation(ctx context.Context, in storage.NewEvaluation) (storage.Evaluation, error) {
	f.mu.Lock()
	f.started = append(f.started, in)
	db := f.db
	f.mu.Unlock()
	return jobqueue.New(db).CreateEvaluation(ctx, in)
}

func (f *fakeEvaluations) CancelEvaluation(ctx context.Context, id string) error {
	f.mu.Lock()
	f.cancelled = append(f.cancelled, id)
	db := f.db
	f.mu.Unlock()
	_, err := jobqueue.New(db).CancelEvaluation(ctx, id)
	return err
}

func (f *fakeEvaluations) startedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.started)
}

// newEvalEnv is the admin API with a fake job loop that can start
// evaluations.
func newEvalEnv(t *testing.T, cfg Config) (*adminEnv, *fakeEvaluations) {
	t.Helper()
	fake := &fakeEvaluations{}
	cfg.AdminTokenHash = sha256Hex(testAdminToken)
	cfg.Jobs = fake
	// The poller may start inside New; it only runs once the database is
	// known, which happens before any project exists.
	e := newAdminEnvWith(t, cfg)
	fake.mu.Lock()
	fake.db = e.db
	fake.mu.Unlock()
	return e, fake
}

// gitRepo is a local git repository with a main branch.
type gitRepo struct {
	t   *testing.T
	dir string
}

func newGitRepo(t *testing.T) *gitRepo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	r := &gitRepo{t: t, dir: filepath.Join(t.TempDir(), "repo")}
	r.git("init", "-q", "-b", "main", r.dir)
	return r
}

func (r *gitRepo) git(args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=Test", "-c", "user.email=test@example.invalid",
		"-c", "commit.gpgsign=false"}, args...)...)
	cmd.Env = append(cmd.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if args[0] != "init" {
		cmd.Dir = r.dir
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit makes a new commit on the current branch and returns its hash.
func (r *gitRepo) commit(msg string) string {
	r.t.Helper()
	r.git("commit", "-q", "--allow-empty", "-m", msg)
	return r.git("rev-parse", "HEAD")
}

// newProjectAt makes team/name (the team if missing) at repository and
// branch.
func newProjectAt(t *testing.T, db *storage.DB, team, name, repository, branch string) storage.Project {
	t.Helper()
	ctx := t.Context()
	tm, err := db.TeamByName(ctx, team)
	if err != nil {
		if tm, err = db.CreateTeam(ctx, team); err != nil {
			t.Fatal(err)
		}
	}
	p, err := db.CreateProject(ctx, storage.NewProject{TeamID: tm.ID, Name: name, Repository: repository, Branch: branch})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func evaluationsOf(t *testing.T, db *storage.DB, projectID string) []storage.Evaluation {
	t.Helper()
	evals, err := jobqueue.New(db).ListEvaluations(t.Context(), projectID, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evals
}

func TestLsRemote(t *testing.T) {
	t.Parallel()
	repo := newGitRepo(t)
	head := repo.commit("one")
	ctx := t.Context()
	if got, err := lsRemote(ctx, repo.dir, "main", gitAccess{allowLocal: true}); err != nil || got != head {
		t.Fatalf("lsRemote = %q, %v; want %s", got, err, head)
	}
	if got, err := lsRemote(ctx, "git+file://"+repo.dir, "main", gitAccess{allowLocal: true}); err != nil || got != head {
		t.Fatalf("lsRemote(git+file://) = %q, %v; want %s", got, err, head)
	}
	// A branch whose name ends like another's is not mistaken for it.
	repo.git("branch", "feature/main")
	if _, err := lsRemote(ctx, repo.dir, "nope", gitAccess{allowLocal: true}); err == nil || !strings.Contains(err.Error(), "no such branch") {
		t.Fatalf("missing branch: %v", err)
	}
	if _, err := lsRemote(ctx, filepath.Join(t.TempDir(), "missing"), "main", gitAccess{allowLocal: true}); err == nil || strings.Contains(err.Error(), "no such branch") {
		t.Fatalf("missing repository: %v", err)
	}
	for _, bad := range [][2]string{{"--upload-pack=touch /tmp/x", "main"}, {repo.dir, "--all"}, {repo.dir, "ma*"}, {"", "main"}} {
		if _, err := lsRemote(ctx, bad[0], bad[1], gitAccess{allowLocal: true}); err == nil {
			t.Fatalf("lsRemote(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func TestPollerStartsEvaluationsOfNewHeads(t *testing.T) {
	t.Parallel()
	e, fake := newEvalEnv(t, Config{AllowLocalRepositories: true})
	ctx := t.Context()
	repo := newGitRepo(t)
	first := repo.commit("first")
	web := newProjectAt(t, e.db, "ops", "web", repo.dir, "main")
	broken := newProjectAt(t, e.db, "ops", "broken", filepath.Join(t.TempDir(), "gone.git"), "main")

	// No evaluation yet: the head is evaluated.
	started := e.srv.pollBranches(ctx)
	if len(started) != 1 || started[0].ProjectID != web.ID || started[0].Commit != first {
		t.Fatalf("first poll started %+v", started)
	}
	evals := evaluationsOf(t, e.db, web.ID)
	if len(evals) != 1 || evals[0].Commit != first || evals[0].RepositoryURL != repo.dir ||
		strings.Join(evals[0].Wildcards, ",") != "packages.x86_64-linux.*" {
		t.Fatalf("evaluations after the first poll: %+v", evals)
	}
	if !strings.Contains(e.logs.String(), "branch poll: evaluation started") ||
		!strings.Contains(e.logs.String(), "project=ops/web") {
		t.Fatalf("no info line for the started evaluation:\n%s", e.logs.String())
	}

	// The unreachable repository is a warning naming the project.
	logs := e.logs.String()
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "project=ops/broken") {
		t.Fatalf("no warning for the unreachable repository:\n%s", logs)
	}
	if got := evaluationsOf(t, e.db, broken.ID); len(got) != 0 {
		t.Fatalf("unreachable repository got evaluations %+v", got)
	}

	// Unchanged head: nothing new.
	if started := e.srv.pollBranches(ctx); len(started) != 0 {
		t.Fatalf("unchanged head started %+v", started)
	}

	// A new commit starts a second evaluation.
	second := repo.commit("second")
	started = e.srv.pollBranches(ctx)
	if len(started) != 1 || started[0].Commit != second {
		t.Fatalf("new head started %+v", started)
	}
	evals = evaluationsOf(t, e.db, web.ID)
	if len(evals) != 2 || evals[0].Commit != second || evals[1].Commit != first {
		t.Fatalf("evaluations after the new head: %+v", evals)
	}
	if started := e.srv.pollBranches(ctx); len(started) != 0 {
		t.Fatalf("third poll started %+v", started)
	}
	if n := fake.startedCount(); n != 2 {
		t.Fatalf("the job loop started %d evaluations, want 2", n)
	}
}

func TestPollerRunsOnItsInterval(t *testing.T) {
	t.Parallel()
	repo := newGitRepo(t)
	head := repo.commit("first")
	e, _ := newEvalEnv(t, Config{PollInterval: 20 * time.Millisecond, AllowLocalRepositories: true})
	web := newProjectAt(t, e.db, "ops", "web", repo.dir, "main")
	deadline := time.Now().Add(10 * time.Second)
	for len(evaluationsOf(t, e.db, web.ID)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the poller started no evaluation:\n%s", e.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	next := repo.commit("second")
	for {
		evals := evaluationsOf(t, e.db, web.ID)
		if len(evals) >= 2 {
			if len(evals) != 2 || evals[0].Commit != next || evals[1].Commit != head {
				t.Fatalf("evaluations %+v", evals)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the poller missed the new head:\n%s", e.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Close waits for the poller (a leak would fail -race runs' cleanup).
	e.srv.Close()
}

func TestPollerNeedsEvaluationControl(t *testing.T) {
	t.Parallel()
	e := newAdminEnvWith(t, Config{AdminTokenHash: sha256Hex(testAdminToken), PollInterval: time.Millisecond})
	if !strings.Contains(e.logs.String(), "branch polling disabled") {
		t.Fatalf("no warning about the missing job loop:\n%s", e.logs.String())
	}
	if started := e.srv.pollBranches(t.Context()); started != nil {
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
	e, _ := newEvalEnv(t, Config{SSH: host.Program, DialKey: box})
	repo := newGitRepo(t)
	head := repo.commit("first")
	p := newProjectAt(t, e.db, "ops", "private", "ssh://git.example.invalid"+repo.dir, "main")

	if started := e.srv.pollBranches(t.Context()); len(started) != 0 {
		t.Fatalf("a poll without the deploy key started %+v", started)
	}
	if !strings.Contains(e.logs.String(), "Permission denied") {
		t.Fatalf("no warning with the host's refusal:\n%s", e.logs.String())
	}
	var key admin.DeployKeyView
	e.must(200, "POST", projectPath("ops/private")+"/deploy-key", nil, &key)
	started := e.srv.pollBranches(t.Context())
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
	if strings.Contains(e.logs.String(), "PRIVATE KEY") {
		t.Error("the private key appears in the server log")
	}
}

// A commit a push webhook evaluated is not evaluated again by the poller,
// and a pull request's evaluation (the newest) does not count as the
// branch's.
func TestPollerSkipsPushedCommitsAndIgnoresPullRequests(t *testing.T) {
	t.Parallel()
	e, _ := newEvalEnv(t, Config{AllowLocalRepositories: true})
	ctx := t.Context()
	repo := newGitRepo(t)
	head := repo.commit("first")
	web := newProjectAt(t, e.db, "ops", "web", repo.dir, "main")
	pushed := web.EvaluationAt(head)
	pushed.Source = storage.SourcePush
	if _, err := jobqueue.New(e.db).CreateEvaluation(ctx, pushed); err != nil {
		t.Fatal(err)
	}
	pr := web.EvaluationAt("0123456789abcdef0123456789abcdef01234567")
	pr.Source, pr.PRNumber, pr.TargetBranch = storage.SourcePR, 4, "main"
	if _, err := jobqueue.New(e.db).CreateEvaluation(ctx, pr); err != nil {
		t.Fatal(err)
	}
	if started := e.srv.pollBranches(ctx); len(started) != 0 {
		t.Fatalf("the poller evaluated the pushed commit again: %+v", started)
	}
	second := repo.commit("second")
	started := e.srv.pollBranches(ctx)
	if len(started) != 1 || started[0].Commit != second || started[0].Source != storage.SourcePoll {
		t.Fatalf("new head started %+v", started)
	}
}
