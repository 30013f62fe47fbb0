package server_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// A forge's evaluations on the dashboard: the project's list and the
// evaluation's page show the pull request ("PR #12 → main") or the
// branch, and the source; a pull request's evaluation waiting for
// approval shows as such, with an Approve form for an admin login only;
// approving through the form needs the session's CSRF token and starts
// the evaluation.
func TestDashboardPullRequestApproval(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := storage.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	quiet := slog.New(slog.DiscardHandler)
	sched := scheduler.New(db, scheduler.Config{Logger: quiet})
	if err := sched.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv := server.New(db, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken), Jobs: sched, Logger: quiet})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); srv.Close(); sched.Close() })

	team, err := db.CreateTeam(ctx, "ops")
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: "web", Repository: "https://example.invalid/web.git", Branch: "trunk"})
	if err != nil {
		t.Fatal(err)
	}
	in := p.EvaluationAt(strings.Repeat("b", 40))
	in.Source, in.PRNumber, in.TargetBranch, in.AwaitApproval = storage.SourcePR, 12, "main", true
	pr, err := jobqueue.New(db).CreateEvaluation(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	in = p.EvaluationAt(strings.Repeat("c", 40))
	in.Source = storage.SourcePush
	if _, err := jobqueue.New(db).CreateEvaluation(ctx, in); err != nil {
		t.Fatal(err)
	}
	// A forge's branch name reaches the page without its bidirectional overrides.
	in = p.EvaluationAt(strings.Repeat("d", 40))
	in.Source, in.PRNumber, in.TargetBranch = storage.SourcePR, 13, "rel\u202eease"
	if _, err := jobqueue.New(db).CreateEvaluation(ctx, in); err != nil {
		t.Fatal(err)
	}
	evalPage, approve := "/evaluations/"+pr.ID, "/evaluations/"+pr.ID+"/approve"
	approveForm := `action="` + approve + `"`

	op := newBrowser(t, hs.URL)
	if code, _, _ := op.post("/login", url.Values{"token": {servertest.AdminToken}}); code != http.StatusSeeOther {
		t.Fatalf("login: %d", code)
	}
	code, body, _ := op.get("/projects/" + p.ID)
	if code != 200 {
		t.Fatalf("project page: %d", code)
	}
	for _, want := range []string{
		`<td class="ref">PR #12 → main</td><td class="source">PR</td>`,
		`<td class="ref">trunk</td><td class="source">push</td>`,
		`<td class="ref">PR #13 → release</td>`,
		`>waiting for approval</span>`,
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("project page lacks %q:\n%s", want, body)
		}
	}
	code, body, _ = op.get(evalPage)
	if code != 200 {
		t.Fatalf("evaluation page: %d", code)
	}
	for _, want := range []string{
		`<span id="evaluation-ref">PR #12 → main</span>`,
		`<span id="evaluation-source">PR</span>`,
		`>waiting for approval</span>`,
		approveForm,
	} {
		if !strings.Contains(body, want) {
			t.Fatalf("evaluation page lacks %q:\n%s", want, body)
		}
	}

	// A read token sees the wait but no Approve, and may not approve.
	_, readToken, err := db.CreateAPIToken(ctx, "viewer", storage.ScopeRead)
	if err != nil {
		t.Fatal(err)
	}
	reader := newBrowser(t, hs.URL)
	if code, _, _ := reader.post("/login", url.Values{"token": {readToken}}); code != http.StatusSeeOther {
		t.Fatalf("read token login: %d", code)
	}
	if code, body, _ := reader.get(evalPage); code != 200 || !strings.Contains(body, "waiting for approval") || strings.Contains(body, approveForm) {
		t.Fatalf("reader's evaluation page (%d) shows no wait or an Approve form:\n%s", code, body)
	}
	if code, body, _ := reader.post(approve, url.Values{"csrf": {reader.csrf(evalPage)}}); code != http.StatusForbidden || !strings.Contains(body, "only read") {
		t.Fatalf("read token approving: %d", code)
	}

	// Logged out: a private project's evaluation is not found; a public
	// one's shows the wait, without Approve.
	anon := newBrowser(t, hs.URL)
	if code, _, _ := anon.get(evalPage); code != http.StatusNotFound {
		t.Fatalf("private evaluation logged out: %d", code)
	}
	if err := db.SetProjectPublic(ctx, p.ID, true); err != nil {
		t.Fatal(err)
	}
	if code, body, _ := anon.get(evalPage); code != 200 || !strings.Contains(body, "PR #12 → main") || strings.Contains(body, approveForm) {
		t.Fatalf("public evaluation logged out (%d) lacks the PR or shows Approve:\n%s", code, body)
	}
	if code, _, _ := anon.post(approve, url.Values{}); code != http.StatusUnauthorized {
		t.Fatalf("approving logged out: %d", code)
	}

	// Forged: no CSRF token, or another site's form; still waiting.
	if code, _, _ := op.post(approve, url.Values{}); code != http.StatusForbidden {
		t.Fatalf("approve without CSRF token: %d", code)
	}
	token := op.csrf(evalPage)
	req, _ := http.NewRequest("POST", hs.URL+approve, strings.NewReader(url.Values{"csrf": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	resp, err := op.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site approve: %d", resp.StatusCode)
	}
	if e, err := jobqueue.New(db).Evaluation(ctx, pr.ID); err != nil || e.Status != storage.EvaluationWaiting {
		t.Fatalf("after the refused forms: %s %v", e.Status, err)
	}

	// The admin's form approves it: it is queued to run.
	code, _, h := op.post(approve, url.Values{"csrf": {token}})
	if code != http.StatusSeeOther || h.Get("Location") != evalPage {
		t.Fatalf("approve: %d to %q", code, h.Get("Location"))
	}
	if e, err := jobqueue.New(db).Evaluation(ctx, pr.ID); err != nil || e.Status != storage.EvaluationQueued {
		t.Fatalf("after approval: %s %v", e.Status, err)
	}
	if _, body, _ := op.get(evalPage); strings.Contains(body, "waiting for approval") || strings.Contains(body, approveForm) {
		t.Fatalf("the approved evaluation still shows the wait:\n%s", body)
	}
	if code, body, _ := op.post(approve, url.Values{"csrf": {token}}); code != http.StatusConflict || !strings.Contains(body, "not waiting for approval") {
		t.Fatalf("approving twice: %d\n%s", code, body)
	}
}
