package server_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// browser is a cookie-keeping client that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (b *browser) get(path string) (int, string, http.Header) {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

func (b *browser) post(path string, form url.Values) (int, string, http.Header) {
	b.t.Helper()
	req, _ := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.base)
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

func (b *browser) csrf(page string) string {
	b.t.Helper()
	_, body, _ := b.get(page)
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("no CSRF token on %s", page)
	}
	return m[1]
}

// failedBuildWithLog makes an evaluation of project with one failed build
// whose log is log, and one running build.
func failedBuildWithLog(t *testing.T, db *storage.DB, projectID string, log string) (evalID, failedID, runningID, runningJob string) {
	t.Helper()
	queue := jobqueue.New(db)
	ctx := t.Context()
	ev, err := queue.CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: projectID, RepositoryURL: "https://example.invalid/x.git",
		Commit: strings.Repeat("a", 40), Wildcards: []string{"packages.x86_64-linux.*"}})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := queue.PendingJobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	worker := storage.NewID()
	var flake string
	for _, j := range jobs {
		if j.EvaluationID == ev.ID {
			flake = j.JobID
		}
	}
	a, err := queue.ClaimJob(ctx, flake, worker)
	if err != nil {
		t.Fatal(err)
	}
	drv := func(n string) string { return "/nix/store/" + strings.Repeat(n, 32) + "-" + n + ".drv" }
	out := func(n string) []storage.BuildOutputPath {
		return []storage.BuildOutputPath{{Name: "out", Path: "/nix/store/" + strings.Repeat(n, 32) + "-" + n}}
	}
	if err := queue.AddDiscoveredDerivations(ctx, ev.ID, []storage.DiscoveredBuild{
		{Attr: "packages.x86_64-linux.bad", DrvPath: drv("b"), Outputs: out("b"), Architecture: "x86_64-linux"},
		{Attr: "packages.x86_64-linux.slow", DrvPath: drv("s"), Outputs: out("s"), Architecture: "x86_64-linux"},
	}); err != nil {
		t.Fatal(err)
	}
	ready, err := queue.CompleteFlakeJob(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	pending, err := queue.PendingJobsByID(ctx, ready)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range pending {
		a, err := queue.ClaimJob(ctx, j.JobID, worker)
		if err != nil {
			t.Fatal(err)
		}
		if j.Attr == "packages.x86_64-linux.bad" {
			if err := queue.AppendJobLog(ctx, j.JobID, []byte(log)); err != nil {
				t.Fatal(err)
			}
			if _, _, err := queue.FailJob(ctx, a, storage.FailurePermanent, "builder failed with exit code 1", 1); err != nil {
				t.Fatal(err)
			}
			failedID = j.BuildID
		} else {
			runningID, runningJob = j.BuildID, j.JobID
		}
	}
	return ev.ID, failedID, runningID, runningJob
}

// The dashboard's access: pages need a login (admin token or a scoped
// API token), the session cookie is HttpOnly and SameSite=Strict, forms
// need the session's CSRF token, a read token may not act, a public
// project's evaluation, build and log are readable logged out and a
// private one's are not, and a log's HTML and escape sequences are shown
// as inert text.
func TestDashboardAccess(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	_, p, _ := e.Seed()
	evalID, failedID, _, _ := failedBuildWithLog(t, e.DB, p.ID, "compiling\n<script>alert(1)</script>\n\x1b[31mred\x1b[0m \x1b]0;title\x07done\n")

	anon := newBrowser(t, e.Base)
	if code, _, h := anon.get("/"); code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), "/login") {
		t.Fatalf("logged-out overview: %d to %q", code, h.Get("Location"))
	}
	for _, path := range []string{"/evaluations/" + evalID, "/builds/" + failedID, "/builds/" + failedID + "/log", "/projects/" + p.ID} {
		if code, body, _ := anon.get(path); code != http.StatusNotFound || strings.Contains(body, "alert") {
			t.Fatalf("private %s logged out: %d", path, code)
		}
	}
	if code, body, _ := anon.post("/login", url.Values{"token": {"wrong"}}); code != http.StatusUnauthorized || !strings.Contains(body, "Wrong or revoked token") {
		t.Fatalf("wrong login: %d", code)
	}

	op := newBrowser(t, e.Base)
	code, _, h := op.post("/login", url.Values{"token": {servertest.AdminToken}, "next": {"/workers"}})
	if code != http.StatusSeeOther || h.Get("Location") != "/workers" {
		t.Fatalf("login: %d to %q", code, h.Get("Location"))
	}
	cookie := h.Get("Set-Cookie")
	for _, want := range []string{"gradient_session=", "HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(cookie, want) {
			t.Fatalf("session cookie %q lacks %s", cookie, want)
		}
	}
	if strings.Contains(cookie, "Secure") {
		t.Fatalf("cookie %q is Secure over plain HTTP", cookie)
	}
	for _, path := range []string{"/", "/projects", "/workers", "/caches", "/caches/main", "/projects/" + p.ID, "/evaluations/" + evalID, "/evaluations/" + evalID + "?status=failed"} {
		if code, body, h := op.get(path); code != 200 || !strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Fatalf("%s: %d\n%s", path, code, body)
		}
	}
	code, body, _ := op.get("/builds/" + failedID)
	if code != 200 {
		t.Fatalf("build page: %d", code)
	}
	if strings.Contains(body, "<script>alert") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatalf("the log's HTML is not escaped:\n%s", body)
	}
	if strings.ContainsRune(body, 0x1b) || !strings.Contains(body, "red done") {
		t.Fatalf("escape sequences not neutralised:\n%s", body)
	}
	if !strings.Contains(body, "Permanent") || !strings.Contains(body, "builder failed with exit code 1") {
		t.Fatal("the failure and its kind are not shown")
	}

	// CSRF: a form without the session's token, or from another site, does nothing.
	restart := "/evaluations/" + evalID + "/restart-failed"
	if code, _, _ := op.post(restart, url.Values{}); code != http.StatusForbidden {
		t.Fatalf("action without CSRF token: %d", code)
	}
	token := op.csrf("/evaluations/" + evalID)
	req, _ := http.NewRequest("POST", e.Base+restart, strings.NewReader(url.Values{"csrf": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	if resp, err := op.c.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site action: %v %v", resp, err)
	}
	// Without a job loop the API answers 503, and the dashboard says so.
	if code, body, _ := op.post(restart, url.Values{"csrf": {token}}); code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot restart") {
		t.Fatalf("restart through the API: %d\n%s", code, body)
	}

	// A read token logs in, reads, and may not act.
	var rt admin.TokenView
	e.Must(201, "POST", "/api/v1/tokens", map[string]any{"name": "viewer", "scope": "read"}, &rt)
	e.Remember(rt.Token)
	reader := newBrowser(t, e.Base)
	if code, _, _ := reader.post("/login", url.Values{"token": {rt.Token}}); code != http.StatusSeeOther {
		t.Fatalf("read token login: %d", code)
	}
	if code, _, _ := reader.get("/evaluations/" + evalID); code != 200 {
		t.Fatalf("reader: %d", code)
	}
	rtoken := reader.csrf("/evaluations/" + evalID)
	if code, body, _ := reader.post(restart, url.Values{"csrf": {rtoken}}); code != http.StatusForbidden || !strings.Contains(body, "only read") {
		t.Fatalf("read token acting: %d", code)
	}
	// Revoking the token ends its session.
	e.Must(204, "DELETE", "/api/v1/tokens/"+rt.ID, nil, nil)
	if code, _, _ := reader.get("/evaluations/" + evalID); code != http.StatusNotFound {
		t.Fatalf("session of a revoked token: %d", code)
	}

	// Public: readable logged out, the rest still not.
	e.Must(200, "PUT", servertest.ProjectPath(p.ID)+"/public", nil, nil)
	for _, path := range []string{"/projects/" + p.ID, "/evaluations/" + evalID, "/builds/" + failedID, "/builds/" + failedID + "/log"} {
		if code, _, _ := anon.get(path); code != 200 {
			t.Fatalf("public %s logged out: %d", path, code)
		}
	}
	for _, path := range []string{"/", "/projects", "/workers", "/caches"} {
		if code, _, _ := anon.get(path); code != http.StatusSeeOther {
			t.Fatalf("%s logged out with a public project: %d", path, code)
		}
	}
	if code, body, _ := anon.get("/projects/" + p.ID); code != 200 || strings.Contains(body, "start-evaluation") {
		t.Fatalf("a logged-out viewer sees actions: %d", code)
	}

	// Logout ends the session.
	if code, _, _ := op.post("/logout", url.Values{"csrf": {op.csrf("/")}}); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	if code, _, _ := op.get("/workers"); code != http.StatusSeeOther {
		t.Fatalf("after logout: %d", code)
	}
}

// sseEvent is one message of a log stream.
type sseEvent struct{ id, event, data string }

func readEvents(t *testing.T, r *bufio.Reader, n int, stopAtEnd bool) []sseEvent {
	t.Helper()
	var out []sseEvent
	var ev sseEvent
	for len(out) < n {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream: %v after %d events", err, len(out))
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if ev.data != "" || ev.event != "" {
				out = append(out, ev)
				if stopAtEnd && ev.event == "end" {
					return out
				}
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[6:]
		}
	}
	return out
}

// The live log: lines appended while a build runs reach the stream once
// each, in order, as complete lines; a reconnect with Last-Event-ID
// resumes after the last line seen; the build's end ends the stream.
func TestDashboardLogStream(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	_, p, _ := e.Seed()
	e.Must(200, "PUT", servertest.ProjectPath(p.ID)+"/public", nil, nil)
	_, _, running, job := failedBuildWithLog(t, e.DB, p.ID, "x\n")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream := func(lastID string) (*bufio.Reader, func()) {
		req, _ := http.NewRequestWithContext(ctx, "GET", e.Base+"/builds/"+running+"/log/stream", nil)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return bufio.NewReader(resp.Body), func() { resp.Body.Close() }
	}
	r, stop := stream("")
	if err := jobqueue.New(e.DB).AppendJobLog(t.Context(), job, []byte("line 1\nline 2\nhalf")); err != nil {
		t.Fatal(err)
	}
	got := readEvents(t, r, 2, false)
	if got[0].data != "line 1" || got[0].id != "7" || got[1].data != "line 2" || got[1].id != "14" {
		t.Fatalf("first events %+v", got)
	}
	stop()
	if err := jobqueue.New(e.DB).AppendJobLog(t.Context(), job, []byte(" line \x1b[1m3\x1b[0m\n<b>4</b>\n")); err != nil {
		t.Fatal(err)
	}
	r, stop = stream(got[1].id)
	defer stop()
	got = readEvents(t, r, 2, false)
	if got[0].data != "half line 3" || got[1].data != "<b>4</b>" {
		t.Fatalf("resumed events %+v", got)
	}
	// The build ends: the stream says so and closes.
	var assignment string
	open, err := jobqueue.New(e.DB).OpenAssignments(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range open {
		if a.JobID == job {
			assignment = a.AssignmentID
		}
	}
	if err := jobqueue.New(e.DB).AppendJobLog(t.Context(), job, []byte("last, no newline")); err != nil {
		t.Fatal(err)
	}
	if _, err := jobqueue.New(e.DB).CompleteBuild(t.Context(), assignment, nil); err != nil {
		t.Fatal(err)
	}
	got = readEvents(t, r, 2, true)
	if len(got) != 2 || got[0].data != "last, no newline" || got[1].event != "end" || got[1].data != "succeeded" {
		t.Fatalf("final events %+v", got)
	}
	waitfor.True(t, "the stream closed after its end", func() bool {
		_, err := r.ReadByte()
		return err != nil
	})
}
