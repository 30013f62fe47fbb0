package servertest

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

// Evaluations is a job loop that starts and cancels evaluations in
// storage directly, as the scheduler does minus the workers.
type Evaluations struct {
	mu        sync.Mutex
	db        *storage.DB // set once the test's database is open
	started   []storage.NewEvaluation
	cancelled []string
	progress  map[string]wire.BuildProgress // by build ID
}

var (
	_ authority.JobLoop        = (*Evaluations)(nil)
	_ server.EvaluationControl = (*Evaluations)(nil)
)

func (f *Evaluations) BuildProgress(buildID string) (wire.BuildProgress, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.progress[buildID]
	return p, ok
}

func (f *Evaluations) SessionStarted(*authority.LiveWorker)                       {}
func (f *Evaluations) HandleJobMessage(*authority.LiveWorker, wire.ClientMessage) {}
func (f *Evaluations) SessionEnded(*authority.LiveWorker, string)                 {}

func (f *Evaluations) StartEvaluation(ctx context.Context, in storage.NewEvaluation) (storage.Evaluation, error) {
	f.mu.Lock()
	f.started = append(f.started, in)
	db := f.db
	f.mu.Unlock()
	return jobqueue.New(db).CreateEvaluation(ctx, in)
}

func (f *Evaluations) CancelEvaluation(ctx context.Context, id string) error {
	f.mu.Lock()
	f.cancelled = append(f.cancelled, id)
	db := f.db
	f.mu.Unlock()
	_, err := jobqueue.New(db).CancelEvaluation(ctx, id)
	return err
}

// Started is what the loop was asked to start, in order.
func (f *Evaluations) Started() []storage.NewEvaluation {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.started)
}

// StartedCount is len(Started()).
func (f *Evaluations) StartedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.started)
}

// Cancelled are the evaluation IDs the loop was asked to cancel, in order.
func (f *Evaluations) Cancelled() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cancelled)
}

// SetProgress makes BuildProgress answer p for its build.
func (f *Evaluations) SetProgress(p wire.BuildProgress) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.progress == nil {
		f.progress = map[string]wire.BuildProgress{}
	}
	f.progress[p.BuildID] = p
}

// NewEvalEnv is the admin API with an Evaluations job loop, which can
// start evaluations.
func NewEvalEnv(t *testing.T, cfg server.Config) (*AdminEnv, *Evaluations) {
	t.Helper()
	fake := &Evaluations{}
	cfg.AdminTokenHash = SHA256Hex(AdminToken)
	cfg.Jobs = fake
	// The poller may start inside New; it only runs once the database is
	// known, which happens before any project exists.
	e := NewAdminEnvWith(t, cfg)
	fake.mu.Lock()
	fake.db = e.DB
	fake.mu.Unlock()
	return e, fake
}

// NewEvaluations is a job loop over db for a server the test builds itself.
func NewEvaluations(db *storage.DB) *Evaluations { return &Evaluations{db: db} }

// GitRepo is a local git repository with a main branch.
type GitRepo struct {
	t   *testing.T
	Dir string
}

// NewGitRepo makes an empty repository (skipping the test without git).
func NewGitRepo(t *testing.T) *GitRepo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	r := &GitRepo{t: t, Dir: filepath.Join(t.TempDir(), "repo")}
	r.Git("init", "-q", "-b", "main", r.Dir)
	return r
}

// Git runs git in the repository (init: where it says), returning its
// trimmed output.
func (r *GitRepo) Git(args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=Test", "-c", "user.email=test@example.invalid",
		"-c", "commit.gpgsign=false"}, args...)...)
	cmd.Env = append(cmd.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if args[0] != "init" {
		cmd.Dir = r.Dir
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// Commit makes a new commit on the current branch and returns its hash.
func (r *GitRepo) Commit(msg string) string {
	r.t.Helper()
	r.Git("commit", "-q", "--allow-empty", "-m", msg)
	return r.Git("rev-parse", "HEAD")
}

// NewProjectAt makes team/name (the team if missing) at repository and
// branch.
func NewProjectAt(t *testing.T, db *storage.DB, team, name, repository, branch string) storage.Project {
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

// EvaluationsOf lists a project's evaluations, newest first.
func EvaluationsOf(t *testing.T, db *storage.DB, projectID string) []storage.Evaluation {
	t.Helper()
	evals, err := jobqueue.New(db).ListEvaluations(t.Context(), projectID, 0)
	if err != nil {
		t.Fatal(err)
	}
	return evals
}
