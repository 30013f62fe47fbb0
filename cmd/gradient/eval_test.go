package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

// evalJobs is a job loop that starts and cancels evaluations in storage
// directly (server.EvaluationControl without workers).
type evalJobs struct{ db *storage.DB }

func (j evalJobs) SessionStarted(*authority.LiveWorker)                       {}
func (j evalJobs) HandleJobMessage(*authority.LiveWorker, wire.ClientMessage) {}
func (j evalJobs) SessionEnded(*authority.LiveWorker, string)                 {}

func (j evalJobs) StartEvaluation(ctx context.Context, in storage.NewEvaluation) (storage.Evaluation, error) {
	return jobqueue.New(j.db).CreateEvaluation(ctx, in)
}

func (j evalJobs) CancelEvaluation(ctx context.Context, id string) error {
	_, err := jobqueue.New(j.db).CancelEvaluation(ctx, id)
	return err
}

// The admin API's start and cancel need the scheduler to be an
// EvaluationControl (server cannot import scheduler to check it).
var (
	_ server.EvaluationControl = evalJobs{}
	_ server.EvaluationControl = (*scheduler.Scheduler)(nil)
)

// newEvalServer is the admin API with a job loop that can start
// evaluations.
func newEvalServer(t *testing.T) *adminServer {
	t.Helper()
	db, err := storage.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(cliAdminToken))
	// The tests' repositories are local.
	srv := server.New(db, server.Config{AdminTokenHash: hex.EncodeToString(sum[:]), Jobs: evalJobs{db},
		AllowLocalRepositories: true, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
		db.Close()
	})
	return &adminServer{url: hs.URL, db: db}
}

// evalGitRepo makes a git repository with one commit on main and
// returns its directory and head.
func evalGitRepo(t *testing.T) (string, string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	dir := filepath.Join(t.TempDir(), "repo")
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-c", "user.name=Test", "-c", "user.email=test@example.invalid",
			"-c", "commit.gpgsign=false"}, args...)...)
		cmd.Env = append(cmd.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		if args[0] != "init" {
			cmd.Dir = dir
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q", "-b", "main", dir)
	git("commit", "-q", "--allow-empty", "-m", "first")
	return dir, git("rev-parse", "HEAD")
}

// flakeJobOf waits for the pending flake job of the project's newest
// evaluation and returns the evaluation and the job.
func flakeJobOf(t *testing.T, db *storage.DB, projectID string, skip int) (storage.Evaluation, string) {
	t.Helper()
	queue := jobqueue.New(db)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		evals, err := queue.ListEvaluations(t.Context(), projectID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evals) > skip {
			jobs, err := queue.PendingJobs(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range jobs {
				if j.Kind == storage.JobFlake && j.EvaluationID == evals[0].ID {
					return evals[0], j.JobID
				}
			}
			t.Fatalf("no pending flake job for %s", evals[0].ID)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no new evaluation")
	return storage.Evaluation{}, ""
}

// playEvaluation runs an evaluation in storage: it reports hello (an
// entry point) depending on lib; lib builds, hello fails permanently.
func playEvaluation(t *testing.T, db *storage.DB, projectID, worker string) (ev storage.Evaluation, hello, lib string) {
	t.Helper()
	queue := jobqueue.New(db)
	ctx := t.Context()
	ev, flake := flakeJobOf(t, db, projectID, 0)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	a, err := queue.ClaimJob(ctx, flake, worker)
	must(err)
	must(queue.AppendJobLog(ctx, flake, []byte("evaluating\n")))
	drv := func(n string) string { return "/nix/store/" + strings.Repeat("a", 32) + "-" + n + ".drv" }
	out := func(n string) string { return "/nix/store/" + strings.Repeat("b", 32) + "-" + n }
	must(queue.AddDiscoveredDerivations(ctx, ev.ID, []storage.DiscoveredBuild{
		{Attr: "packages.x86_64-linux.hello", DrvPath: drv("hello-2.12"), Architecture: "x86_64-linux",
			Outputs: []storage.BuildOutputPath{{Name: "out", Path: out("hello-2.12")}}, Dependencies: []string{drv("lib-1.0")}},
		{DrvPath: drv("lib-1.0"), Architecture: "x86_64-linux", Outputs: []storage.BuildOutputPath{{Name: "out", Path: out("lib-1.0")}}},
	}))
	ready, err := queue.CompleteFlakeJob(ctx, a)
	must(err)
	next := func(ids []string) storage.PendingJob {
		t.Helper()
		jobs, err := queue.PendingJobsByID(ctx, ids)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("ready %v: %v", jobs, err)
		}
		return jobs[0]
	}
	libJob := next(ready)
	a, err = queue.ClaimJob(ctx, libJob.JobID, worker)
	must(err)
	ready, err = queue.CompleteBuild(ctx, a, []storage.BuildOutputInfo{{Name: "out", StorePath: out("lib-1.0")}})
	must(err)
	helloJob := next(ready)
	a, err = queue.ClaimJob(ctx, helloJob.JobID, worker)
	must(err)
	must(queue.AppendJobLog(ctx, helloJob.JobID, []byte("building hello\nerror: boom\n")))
	_, _, err = queue.FailJob(ctx, a, storage.FailurePermanent, "builder failed\nwith exit code 1", 3)
	must(err)
	return ev, helloJob.BuildID, libJob.BuildID
}

// webProject creates team ops and its project web on repo through the CLI.
func webProject(t *testing.T, s *adminServer, repo string) storage.Project {
	t.Helper()
	s.ok(t, "team", "create", "ops")
	s.ok(t, "project", "create", "ops/web", "--repository", repo)
	p, err := s.db.ProjectByName(t.Context(), mustTeamID(t, s.db, "ops"), "web")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEvalCommands(t *testing.T) {
	t.Parallel()
	s := newEvalServer(t)
	repo, head := evalGitRepo(t)
	p := webProject(t, s, repo)

	// Start at the branch head; the answer names the evaluation.
	out := s.ok(t, "eval", "start", "ops/web")
	mustContain(t, out, "Started evaluation ", " of ops/web at "+head, "gradient eval show ")
	first := uuidPattern.FindString(out)
	worker := storage.NewID()
	ev, hello, lib := playEvaluation(t, s.db, p.ID, worker)
	if ev.ID != first {
		t.Fatalf("played %s, started %s", ev.ID, first)
	}

	// A given commit, with the JSON answer.
	other := strings.Repeat("c", 40)
	var started evaluationInfo
	s.okJSON(t, &started, "eval", "start", "ops/web", "--commit", other)
	if started.Commit != other || started.Status != "queued" || started.Project != "ops/web" {
		t.Fatalf("started %+v", started)
	}
	s.fails(t, exitFail, "full 40-character", "eval", "start", "ops/web", "--commit", "abc123")
	s.fails(t, exitFail, "does not exist", "eval", "start", "ops/nope")
	s.fails(t, exitUsage, "want PROJECT", "eval", "start")

	// List, newest first.
	out = s.ok(t, "eval", "list", "ops/web")
	mustContain(t, out, "EVALUATION", "STATUS", "COMMIT", "DURATION", "ERROR", first, started.ID, head[:12], "queued", "failed")
	if strings.Index(out, started.ID) > strings.Index(out, first) {
		t.Fatalf("list is not newest first:\n%s", out)
	}
	out = s.ok(t, "eval", "list", "ops/web", "--limit", "1")
	if !strings.Contains(out, started.ID) || strings.Contains(out, first) {
		t.Fatalf("--limit 1:\n%s", out)
	}
	s.fails(t, exitFail, "limit", "eval", "list", "ops/web", "--limit", "0")

	// Show: the builds with status, worker, output and failure.
	out = s.ok(t, "eval", "show", first)
	mustContain(t, out, "evaluation:", first, "project:", "ops/web", "commit:", head, "status:", "failed",
		"builds:", "2 (1 failed, 1 succeeded)",
		"BUILD", "ATTR", "STATUS", "DURATION", "WORKER", "OUTPUT", "FAILURE",
		hello, "packages.x86_64-linux.hello", worker, "Permanent: builder failed with exit code 1",
		lib, "(dep) lib-1.0", "/nix/store/"+strings.Repeat("b", 32)+"-lib-1.0", "succeeded")
	var shown evaluationInfo
	s.okJSON(t, &shown, "eval", "show", first)
	if len(shown.Builds) != 2 || shown.Builds[0].ID != hello || shown.Builds[0].FailureKind != "Permanent" {
		t.Fatalf("show --json: %+v", shown)
	}
	s.fails(t, exitFail, "not found", "eval", "show", storage.NewID())
	s.fails(t, exitFail, "UUID", "eval", "show", "nope")

	// Builds and logs.
	out = s.ok(t, "build", "show", hello)
	mustContain(t, out, "build:", hello, "evaluation:", first, "attr:", "packages.x86_64-linux.hello",
		"status:", "failed", "worker:", worker, "outputs:", "out=/nix/store/", "failure kind:", "Permanent",
		"error:", "builder failed with exit code 1")
	if got := s.ok(t, "build", "log", hello); got != "building hello\nerror: boom\n" {
		t.Fatalf("build log %q", got)
	}
	if got := s.ok(t, "build", "log", lib); got != "" {
		t.Fatalf("empty build log %q", got)
	}
	if got := s.ok(t, "eval", "log", first); got != "evaluating\n" {
		t.Fatalf("eval log %q", got)
	}
	s.fails(t, exitFail, "not found", "build", "log", storage.NewID())
	s.fails(t, exitFail, "not found", "build", "show", storage.NewID())

	// Cancel.
	mustContain(t, s.ok(t, "eval", "cancel", started.ID), "Evaluation "+started.ID+" is cancelled")
	s.fails(t, exitFail, "has failed", "eval", "cancel", first)
	mustContain(t, s.ok(t, "eval", "show", started.ID), "cancelled", "builds:", "none")

	// Help and mistakes.
	mustContain(t, s.ok(t, "eval"), "eval start PROJECT", "build log BUILD_ID")
	mustContain(t, s.ok(t, "build", "--help"), "eval start PROJECT")
	s.fails(t, exitUsage, `unknown command "eval bogus"`, "eval", "bogus")
	s.fails(t, exitUsage, "--wait-interval must be positive", "eval", "start", "ops/web", "--wait", "--wait-interval", "0s")
}

func TestEvalStartWait(t *testing.T) {
	t.Parallel()
	s := newEvalServer(t)
	repo, head := evalGitRepo(t)
	p := webProject(t, s, repo)
	type result struct {
		code        int
		out, errOut string
	}
	wait := func(args ...string) <-chan result {
		done := make(chan result, 1)
		go func() {
			code, out, errOut := gradientEnv(t, s.env(), append([]string{"eval", "start", "ops/web", "--wait", "--wait-interval", "10ms"}, args...)...)
			done <- result{code, out, errOut}
		}()
		return done
	}

	// An evaluation without builds succeeds: exit 0 and its summary.
	done := wait()
	ev, flake := flakeJobOf(t, s.db, p.ID, 0)
	a, err := jobqueue.New(s.db).ClaimJob(t.Context(), flake, storage.NewID())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobqueue.New(s.db).CompleteFlakeJob(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != exitOK {
		t.Fatalf("--wait on success: exit %d, stdout %q, stderr %q", r.code, r.out, r.errOut)
	}
	mustContain(t, r.out, "Started evaluation "+ev.ID, "at "+head, "status:", "succeeded", "builds:", "none")
	mustContain(t, r.errOut, "evaluation "+ev.ID+": succeeded")

	// A failed flake job: exit 1 with the reason; --json prints the
	// final evaluation only.
	done = wait("--json")
	ev, flake = flakeJobOf(t, s.db, p.ID, 1)
	if a, err = jobqueue.New(s.db).ClaimJob(t.Context(), flake, storage.NewID()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := jobqueue.New(s.db).FailJob(t.Context(), a, storage.FailurePermanent, "flake.nix: syntax error", 3); err != nil {
		t.Fatal(err)
	}
	r = <-done
	if r.code != exitFail || !strings.Contains(r.out, `"status": "failed"`) || !strings.Contains(r.out, "syntax error") ||
		!strings.Contains(r.out, ev.ID) || strings.Contains(r.out, "Started") {
		t.Fatalf("--wait on failure: exit %d, stdout %q, stderr %q", r.code, r.out, r.errOut)
	}
}

func mustTeamID(t *testing.T, db *storage.DB, name string) string {
	t.Helper()
	team, err := db.TeamByName(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return team.ID
}

func TestEvalFormatting(t *testing.T) {
	t.Parallel()
	started := time.Now()
	for ms, want := range map[int64]string{0: "0ms", 400: "400ms", 12_345: "12.3s", 83_400: "1m23s", 3_723_000: "1h2m3s"} {
		if got := evalDuration(ms, started); got != want {
			t.Errorf("evalDuration(%d) = %q, want %q", ms, got, want)
		}
	}
	if got := evalDuration(0, time.Time{}); got != "-" {
		t.Errorf("evalDuration before the start = %q", got)
	}
	if got := evalDrvName("/nix/store/" + strings.Repeat("a", 32) + "-hello-2.12.drv"); got != "hello-2.12" {
		t.Errorf("evalDrvName = %q", got)
	}
	if got := evalClip("abcdef", 4); got != "abc…" {
		t.Errorf("evalClip = %q", got)
	}
	b := buildInfo{FailureKind: "Timeout", Error: "no output\nfor 3600 s"}
	if got := b.failure(); got != "Timeout: no output for 3600 s" {
		t.Errorf("failure = %q", got)
	}
}

func TestBuildStatusShowsProgress(t *testing.T) {
	total, bytesTotal := uint32(5), uint64(40<<20+100<<10)
	b := buildInfo{Status: "building", StatusText: "building",
		Progress: &progressInfo{Phase: "upload", BytesDone: 12 << 20, BytesTotal: &bytesTotal, PathsDone: 2, PathsTotal: &total}}
	if got, want := b.statusText(), "building (upload: 2 of 5 paths, 12.0 MiB of 40.1 MiB)"; got != want {
		t.Errorf("statusText = %q, want %q", got, want)
	}
	b.Progress = &progressInfo{Phase: "prefetch", BytesDone: 512, PathsDone: 1}
	if got, want := b.statusText(), "building (prefetch: 1 path, 512 B)"; got != want {
		t.Errorf("statusText = %q, want %q", got, want)
	}
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 5 << 30: "5.0 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
