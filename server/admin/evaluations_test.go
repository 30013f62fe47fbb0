package admin_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

// runEvaluation plays a worker in storage: the flake job of evalID
// reports a top-level build "hello" and a dependency "lib"; lib builds,
// hello fails permanently after logging.
func runEvaluation(t *testing.T, db *storage.DB, evalID, worker string) (hello, lib storage.Build) {
	t.Helper()
	queue := jobqueue.New(db)
	ctx := t.Context()
	jobs, err := queue.PendingJobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var flake string
	for _, j := range jobs {
		if j.Kind == storage.JobFlake && j.EvaluationID == evalID {
			flake = j.JobID
		}
	}
	if flake == "" {
		t.Fatalf("no flake job for %s", evalID)
	}
	a, err := queue.ClaimJob(ctx, flake, worker)
	if err != nil {
		t.Fatal(err)
	}
	if err := queue.AppendJobLog(ctx, flake, []byte("evaluating packages.x86_64-linux.*\n")); err != nil {
		t.Fatal(err)
	}
	drv := func(n string) string { return "/nix/store/" + strings.Repeat("a", 32) + "-" + n + ".drv" }
	out := func(n string) string { return "/nix/store/" + strings.Repeat("b", 32) + "-" + n }
	err = queue.AddDiscoveredDerivations(ctx, evalID, []storage.DiscoveredBuild{
		{Attr: "packages.x86_64-linux.hello", DrvPath: drv("hello"), Architecture: "x86_64-linux",
			Outputs: []storage.BuildOutputPath{{Name: "out", Path: out("hello")}}, Dependencies: []string{drv("lib")}},
		{DrvPath: drv("lib"), Architecture: "x86_64-linux", Outputs: []storage.BuildOutputPath{{Name: "out", Path: out("lib")}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ready, err := queue.CompleteFlakeJob(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	step := func(ids []string) storage.PendingJob {
		t.Helper()
		jobs, err := queue.PendingJobsByID(ctx, ids)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("ready jobs %v: %v", jobs, err)
		}
		return jobs[0]
	}
	libJob := step(ready)
	a, err = queue.ClaimJob(ctx, libJob.JobID, worker)
	if err != nil {
		t.Fatal(err)
	}
	if ready, err = queue.CompleteBuild(ctx, a, []storage.BuildOutputInfo{{Name: "out", StorePath: out("lib"), NarSize: 42}}); err != nil {
		t.Fatal(err)
	}
	helloJob := step(ready)
	if a, err = queue.ClaimJob(ctx, helloJob.JobID, worker); err != nil {
		t.Fatal(err)
	}
	if err := queue.AppendJobLog(ctx, helloJob.JobID, []byte("building hello\nerror: boom\n")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := queue.FailJob(ctx, a, storage.FailurePermanent, "builder failed with exit code 1", 3); err != nil {
		t.Fatal(err)
	}
	if hello, err = queue.Build(ctx, helloJob.BuildID); err != nil {
		t.Fatal(err)
	}
	if lib, err = queue.Build(ctx, libJob.BuildID); err != nil {
		t.Fatal(err)
	}
	return hello, lib
}

func TestAdminEvaluations(t *testing.T) {
	t.Parallel()
	e, fake := servertest.NewEvalEnv(t, server.Config{AllowLocalRepositories: true})
	repo := servertest.NewGitRepo(t)
	head := repo.Commit("first")
	p := servertest.NewProjectAt(t, e.DB, "ops", "web", repo.Dir, "main")
	path := servertest.ProjectPath("ops/web") + "/evaluations"

	// Without a commit (and without a body): the branch head.
	var ev admin.EvaluationView
	e.Must(201, "POST", path, nil, &ev)
	if ev.Commit != head || ev.Project != "ops/web" || ev.ProjectID != p.ID || ev.Status != "queued" ||
		ev.Terminal || strings.Join(ev.Wildcards, ",") != "packages.x86_64-linux.*" || ev.Repository != repo.Dir {
		t.Fatalf("started %+v", ev)
	}
	if !strings.Contains(e.Logs.String(), "admin: evaluation started") {
		t.Fatal("no log line for the started evaluation")
	}
	// An empty JSON object is the same; a given commit is taken as is.
	var byEmpty, byCommit admin.EvaluationView
	e.Must(201, "POST", path, map[string]any{}, &byEmpty)
	other := strings.Repeat("AB", 20)
	e.Must(201, "POST", servertest.ProjectPath(p.ID)+"/evaluations", map[string]any{"commit": other}, &byCommit)
	if byEmpty.Commit != head || byCommit.Commit != strings.ToLower(other) {
		t.Fatalf("commits %s, %s", byEmpty.Commit, byCommit.Commit)
	}
	e.Fails(400, "full 40-character", "POST", path, map[string]any{"commit": "abc123"})
	e.Fails(400, "unknown field", "POST", path, map[string]any{"sha": head})
	e.Fails(404, "does not exist", "POST", servertest.ProjectPath("ops/nope")+"/evaluations", nil)
	if n := fake.StartedCount(); n != 3 {
		t.Fatalf("%d evaluations started, want 3", n)
	}

	// List: newest first, with a limit.
	var list []admin.EvaluationView
	e.Must(200, "GET", path, nil, &list)
	if len(list) != 3 || list[0].ID != byCommit.ID || list[2].ID != ev.ID {
		t.Fatalf("list %+v", list)
	}
	e.Must(200, "GET", path+"?limit=1", nil, &list)
	if len(list) != 1 || list[0].ID != byCommit.ID {
		t.Fatalf("limit=1: %+v", list)
	}
	e.Fails(400, "limit", "GET", path+"?limit=0", nil)
	e.Fails(400, "limit", "GET", path+"?limit=x", nil)

	// Show: the evaluation with its builds.
	worker := storage.NewID()
	hello, lib := runEvaluation(t, e.DB, ev.ID, worker)
	var shown admin.EvaluationView
	e.Must(200, "GET", "/api/v1/evaluations/"+ev.ID, nil, &shown)
	if shown.Status != "failed" || !shown.Terminal || shown.FinishedAt.IsZero() || len(shown.Builds) != 2 {
		t.Fatalf("shown %+v", shown)
	}
	hv, lv := shown.Builds[0], shown.Builds[1] // entry points first
	if hv.ID != hello.ID || hv.Attr != "packages.x86_64-linux.hello" || hv.Status != "failed" ||
		hv.StatusText != "failed" || hv.FailureKind != "Permanent" || hv.Error != "builder failed with exit code 1" ||
		hv.WorkerID != worker || hv.DrvPath != hello.DrvPath || len(hv.Outputs) != 1 || hv.Outputs[0].Name != "out" {
		t.Fatalf("hello build %+v", hv)
	}
	if lv.ID != lib.ID || lv.Attr != "" || lv.Status != "succeeded" || lv.FailureKind != "" ||
		len(lv.Outputs) != 1 || lv.Outputs[0].Path != lib.OutputInfo[0].StorePath || lv.Outputs[0].NarSize != 42 {
		t.Fatalf("lib build %+v", lv)
	}
	var bv admin.BuildView
	e.Must(200, "GET", "/api/v1/builds/"+hello.ID, nil, &bv)
	if bv.ID != hello.ID || bv.EvaluationID != ev.ID || bv.FailureKind != "Permanent" {
		t.Fatalf("build %+v", bv)
	}

	// Logs are text/plain; errors stay JSON.
	status, ctype, body := e.Text("/api/v1/builds/" + hello.ID + "/log")
	if status != 200 || !strings.HasPrefix(ctype, "text/plain") || body != "building hello\nerror: boom\n" {
		t.Fatalf("build log: %d %q %q", status, ctype, body)
	}
	status, _, body = e.Text("/api/v1/builds/" + lib.ID + "/log")
	if status != 200 || body != "" {
		t.Fatalf("empty build log: %d %q", status, body)
	}
	status, _, body = e.Text("/api/v1/evaluations/" + ev.ID + "/log")
	if status != 200 || body != "evaluating packages.x86_64-linux.*\n" {
		t.Fatalf("evaluation log: %d %q", status, body)
	}
	status, ctype, body = e.Text("/api/v1/builds/" + storage.NewID() + "/log")
	var eb admin.ErrorBody
	if status != 404 || ctype != "application/json" || json.Unmarshal([]byte(body), &eb) != nil || !strings.Contains(eb.Error, "build") {
		t.Fatalf("unknown build log: %d %q %q", status, ctype, body)
	}
	e.Fails(404, "not found", "GET", "/api/v1/builds/"+storage.NewID(), nil)
	e.Fails(400, "UUID", "GET", "/api/v1/builds/nope", nil)
	e.Fails(404, "not found", "GET", "/api/v1/evaluations/"+storage.NewID(), nil)
	e.Fails(400, "UUID", "GET", "/api/v1/evaluations/nope", nil)

	// Cancel: a queued evaluation is cancelled (twice is fine); a finished
	// one is a conflict.
	var cancelled admin.EvaluationView
	e.Must(200, "POST", "/api/v1/evaluations/"+byEmpty.ID+"/cancel", nil, &cancelled)
	if cancelled.Status != "cancelled" || !cancelled.Terminal || cancelled.Project != "ops/web" {
		t.Fatalf("cancelled %+v", cancelled)
	}
	e.Must(200, "POST", "/api/v1/evaluations/"+byEmpty.ID+"/cancel", nil, &cancelled)
	e.Fails(409, "has failed", "POST", "/api/v1/evaluations/"+ev.ID+"/cancel", nil)
	e.Fails(404, "not found", "POST", "/api/v1/evaluations/"+storage.NewID()+"/cancel", nil)
	if cancelled := fake.Cancelled(); len(cancelled) != 3 || cancelled[0] != byEmpty.ID { // the unknown one never reaches it
		t.Errorf("cancel calls %v", cancelled)
	}
}

func TestAdminEvaluationBranchHeadErrors(t *testing.T) {
	t.Parallel()
	e, fake := servertest.NewEvalEnv(t, server.Config{AllowLocalRepositories: true})
	repo := servertest.NewGitRepo(t)
	repo.Commit("first")
	servertest.NewProjectAt(t, e.DB, "ops", "nobranch", repo.Dir, "release")
	servertest.NewProjectAt(t, e.DB, "ops", "gone", filepath.Join(t.TempDir(), "gone.git"), "main")

	e.Fails(400, `cannot resolve the head of branch "release"`, "POST", servertest.ProjectPath("ops/nobranch")+"/evaluations", nil)
	e.Fails(502, `cannot resolve the head of branch "main"`, "POST", servertest.ProjectPath("ops/gone")+"/evaluations", nil)
	// A commit needs no branch head.
	e.Must(201, "POST", servertest.ProjectPath("ops/gone")+"/evaluations", map[string]any{"commit": strings.Repeat("c", 40)}, nil)
	if n := fake.StartedCount(); n != 1 {
		t.Fatalf("%d evaluations started, want 1", n)
	}
}

func TestAdminEvaluationsWithoutJobLoop(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnvWith(t, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken)})
	p := servertest.NewProjectAt(t, e.DB, "ops", "web", "https://example.invalid/web.git", "main")
	ev, err := jobqueue.New(e.DB).CreateEvaluation(t.Context(), p.EvaluationAt(strings.Repeat("d", 40)))
	if err != nil {
		t.Fatal(err)
	}
	e.Fails(503, "no job loop", "POST", servertest.ProjectPath("ops/web")+"/evaluations", map[string]any{"commit": strings.Repeat("d", 40)})
	e.Fails(503, "no job loop", "POST", "/api/v1/evaluations/"+ev.ID+"/cancel", nil)
	// Reading needs no job loop.
	var list []admin.EvaluationView
	e.Must(200, "GET", servertest.ProjectPath("ops/web")+"/evaluations", nil, &list)
	if len(list) != 1 || list[0].ID != ev.ID {
		t.Fatalf("list %+v", list)
	}
	var shown admin.EvaluationView
	e.Must(200, "GET", "/api/v1/evaluations/"+ev.ID, nil, &shown)
	if shown.Status != "queued" || shown.Builds != nil {
		t.Fatalf("shown %+v", shown)
	}
}

// A running build shows its worker's latest transfer progress.
func TestAdminBuildProgress(t *testing.T) {
	t.Parallel()
	e, fake := servertest.NewEvalEnv(t, server.Config{})
	ctx := t.Context()
	p := servertest.NewProjectAt(t, e.DB, "ops", "web", "https://example.invalid/web.git", "main")
	ev, err := jobqueue.New(e.DB).CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: p.ID, RepositoryURL: p.Repository, Commit: strings.Repeat("a", 40)})
	if err != nil {
		t.Fatal(err)
	}
	worker := storage.NewID()
	pending, _ := jobqueue.New(e.DB).PendingJobs(ctx)
	flake, err := jobqueue.New(e.DB).ClaimJob(ctx, pending[0].JobID, worker)
	if err != nil {
		t.Fatal(err)
	}
	drv := storage.DiscoveredBuild{Attr: "packages.x86_64-linux.hello", DrvPath: "/nix/store/00000000000000000000000000000000-hello.drv",
		Outputs: []storage.BuildOutputPath{{Name: "out", Path: "/nix/store/00000000000000000000000000000000-hello"}}, Architecture: "x86_64-linux"}
	if err := jobqueue.New(e.DB).AddDiscoveredDerivations(ctx, ev.ID, []storage.DiscoveredBuild{drv}); err != nil {
		t.Fatal(err)
	}
	ready, err := jobqueue.New(e.DB).CompleteFlakeJob(ctx, flake)
	if err != nil || len(ready) != 1 {
		t.Fatalf("ready %v, %v", ready, err)
	}
	if _, err := jobqueue.New(e.DB).ClaimJob(ctx, ready[0], worker); err != nil {
		t.Fatal(err)
	}
	builds, _ := jobqueue.New(e.DB).EvaluationBuilds(ctx, ev.ID)
	id := builds[0].ID
	var bv admin.BuildView
	e.Must(200, "GET", "/api/v1/builds/"+id, nil, &bv)
	if bv.Status != "building" || bv.Progress != nil {
		t.Fatalf("build before any progress: %s, progress %+v", bv.Status, bv.Progress)
	}
	total := uint32(5)
	fake.SetProgress(wire.BuildProgress{BuildID: id, Phase: wire.ProgressUpload, BytesDone: 3 << 20, PathsDone: 2, PathsTotal: &total})
	e.Must(200, "GET", "/api/v1/builds/"+id, nil, &bv)
	if p := bv.Progress; p == nil || p.Phase != "upload" || p.BytesDone != 3<<20 || p.PathsDone != 2 || p.PathsTotal == nil || *p.PathsTotal != 5 || p.BytesTotal != nil {
		t.Fatalf("progress %+v", bv.Progress)
	}
	var shown admin.EvaluationView
	e.Must(200, "GET", "/api/v1/evaluations/"+ev.ID, nil, &shown)
	if len(shown.Builds) != 1 || shown.Builds[0].Progress == nil {
		t.Fatalf("evaluation's builds %+v: want the progress", shown.Builds)
	}
}
