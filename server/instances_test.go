package server_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forge/forgetest"
	"gradient.dev/gradient/server/forgelink"
	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
)

// serverInstance is one of several servers sharing a PostgreSQL database,
// each with its own connection pool, instance row and fake job loop.
type serverInstance struct {
	db   *storage.DB
	inst *instance.Instance
	srv  *server.Server
	jobs *servertest.Evaluations
	logs *testlog.Buffer
}

// newServerInstances starts n servers on the PostgreSQL database at url
// with cfg (each with its own Instance and job loop).
func newServerInstances(t *testing.T, url string, n int, cfg server.Config) []*serverInstance {
	t.Helper()
	var out []*serverInstance
	for i := range n {
		db, err := storage.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := instance.Join(t.Context(), instance.Config{DB: db, ID: fmt.Sprintf("inst-%c", 'a'+i), Host: "test",
			RenewEvery: 200 * time.Millisecond, Lease: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		si := &serverInstance{db: db, inst: inst, jobs: servertest.NewEvaluations(db), logs: &testlog.Buffer{}}
		c := cfg
		c.Jobs, c.Instance = si.jobs, inst
		c.Logger = slog.New(slog.NewTextHandler(si.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		si.srv = server.New(db, c)
		t.Cleanup(func() {
			si.srv.Close()
			inst.Leave(t.Context())
			db.Close()
			if t.Failed() {
				t.Logf("server %s log:\n%s", inst.ID(), si.logs.String())
			}
		})
		out = append(out, si)
	}
	return out
}

// Two instances poll one project's branch: together once per interval
// (never both in one), and a new head starts one evaluation, not two.
func TestPollerPollsOnOneInstancePerInterval(t *testing.T) {
	t.Parallel()
	url := storagetest.PostgresURL(t)
	db, err := storage.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	repo := servertest.NewGitRepo(t)
	first := repo.Commit("first")
	web := servertest.NewProjectAt(t, db, "ops", "web", repo.Dir, "main")

	const interval = 400 * time.Millisecond
	start := time.Now()
	servers := newServerInstances(t, url, 2, server.Config{PollInterval: interval, AllowLocalRepositories: true})
	waitEvaluations := func(n int) []storage.Evaluation {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			evals := servertest.EvaluationsOf(t, db, web.ID)
			if len(evals) >= n || time.Now().After(deadline) {
				return evals
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if evals := waitEvaluations(1); len(evals) != 1 || evals[0].Commit != first {
		t.Fatalf("evaluations of the first head: %+v", evals)
	}
	second := repo.Commit("second")
	waitEvaluations(2)
	// Several more intervals: neither instance starts anything again.
	time.Sleep(5 * interval)
	for _, s := range servers {
		s.srv.Close()
	}
	elapsed := time.Since(start)
	evals := servertest.EvaluationsOf(t, db, web.ID)
	if len(evals) != 2 || evals[0].Commit != second || evals[1].Commit != first {
		t.Fatalf("evaluations %+v, want one per head", evals)
	}
	if n := servers[0].jobs.StartedCount() + servers[1].jobs.StartedCount(); n != 2 {
		t.Fatalf("the instances started %d evaluations, want 2", n)
	}
	polled, elsewhere := 0.0, 0.0
	for _, s := range servers {
		polled += s.srv.BranchPolls("polled")
		elsewhere += s.srv.BranchPolls("elsewhere")
	}
	// A poll's lease lasts 9/10 of the interval from its start: polls of
	// the branch start at least that far apart, whichever instance runs them.
	most := float64(elapsed/(interval*9/10)) + 1
	if polled < 2 || polled > most || elsewhere < 1 {
		t.Fatalf("in %s: %v polls (at most %v) and %v left to the other instance", elapsed, polled, most, elsewhere)
	}
	t.Logf("in %s at a %s interval: %v polls, %v skipped as the other instance's", elapsed.Round(time.Millisecond), interval, polled, elsewhere)
}

// Two instances' forge status posters share one outbox: every status is
// posted once.
func TestForgeStatusPostedOnceAcrossInstances(t *testing.T) {
	t.Parallel()
	url := storagetest.PostgresURL(t)
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	db, err := storage.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fake := forgetest.New(t, forge.GitHub, forgetest.Options{})
	p := servertest.NewProjectAt(t, db, "ops", "web", "https://example.com/web.git", "main")
	if err := forgelink.New(db, box, nil).Set(t.Context(), p, forgelink.Settings{Link: fake.Link()}); err != nil {
		t.Fatal(err)
	}
	servers := newServerInstances(t, url, 2, server.Config{DialKey: box, ForgeStatusInterval: 20 * time.Millisecond})
	const commits = 40
	for i := range commits {
		in := p.EvaluationAt(fmt.Sprintf("%040x", i+1))
		if _, err := jobqueue.New(db).CreateEvaluation(t.Context(), in); err != nil {
			t.Fatal(err)
		}
		for _, s := range servers {
			s.srv.NudgeForgeStatuses()
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		depth, err := db.ForgeStatusDepth(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if depth == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d statuses still unposted", depth)
		}
		time.Sleep(20 * time.Millisecond)
	}
	context := forgelink.StatusContext(p.Name)
	for i := range commits {
		commit := fmt.Sprintf("%040x", i+1)
		if got := fake.Statuses(commit, context); len(got) != 1 || got[0].State != "pending" {
			t.Fatalf("commit %d: the forge received %+v, want one pending status", i+1, got)
		}
	}
	posts := 0
	for _, s := range servers {
		if strings.Contains(s.logs.String(), "forge status posted") {
			posts++
		}
	}
	t.Logf("%d of 2 instances posted statuses", posts)
}
