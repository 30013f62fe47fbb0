package forge_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forge/forgetest"
)

var kinds = []forge.Kind{forge.GitHub, forge.Gitea, forge.GitLab}

const (
	sha1 = "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"
	sha2 = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7"
)

func newClient(t *testing.T, fake *forgetest.Server) forge.Client {
	t.Helper()
	c, err := forge.NewClient(fake.Link(), nil)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	return c
}

// noSecret fails t when err shows a credential of the fake.
func noSecret(t *testing.T, fake *forgetest.Server, err error) {
	t.Helper()
	if err != nil && fake.Token != "" && strings.Contains(err.Error(), fake.Token) {
		t.Fatalf("error shows the token: %v", err)
	}
}

func TestPostStatusMapsStatesPerKind(t *testing.T) {
	long := strings.Repeat("é", 300)
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			fake := forgetest.New(t, kind, forgetest.Options{})
			c := newClient(t, fake)
			ctx := context.Background()
			post := func(s forge.Status) {
				t.Helper()
				if err := c.PostStatus(ctx, s); err != nil {
					t.Fatalf("PostStatus(%+v): %v", s.State, err)
				}
			}
			const target = "https://ci.example.com/evaluations/1"
			post(forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending, Description: "queued", TargetURL: target})
			post(forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending, Running: true, Description: "evaluating"})
			post(forge.Status{Commit: sha1, Context: "gradient", State: forge.StateSuccess, Description: "42 built", TargetURL: target})
			post(forge.Status{Commit: sha1, Context: "gradient/x86_64-linux.hello", State: forge.StateFailure, Description: long})
			post(forge.Status{Commit: strings.ToUpper(sha2), Context: "gradient", State: forge.StateError, Description: "evaluation failed"})

			wantStates := map[forge.Kind][]string{
				forge.GitHub: {"pending", "pending", "success"},
				forge.Gitea:  {"pending", "pending", "success"},
				forge.GitLab: {"pending", "running", "success"},
			}[kind]
			got := fake.Statuses(sha1, "gradient")
			if len(got) != 3 {
				t.Fatalf("received %d statuses for (sha1, gradient), want 3: %+v", len(got), got)
			}
			for i, r := range got {
				if r.State != wantStates[i] {
					t.Errorf("status %d: state %q, want %q", i, r.State, wantStates[i])
				}
			}
			if got[0].TargetURL != target || got[0].Description != "queued" {
				t.Errorf("first status = %+v", got[0])
			}
			attr := fake.Statuses(sha1, "gradient/x86_64-linux.hello")
			wantFailure := map[forge.Kind]string{forge.GitHub: "failure", forge.Gitea: "failure", forge.GitLab: "failed"}[kind]
			if len(attr) != 1 || attr[0].State != wantFailure {
				t.Fatalf("attribute status = %+v, want one %q", attr, wantFailure)
			}
			wantLen := map[forge.Kind]int{forge.GitHub: 140, forge.Gitea: 255, forge.GitLab: 255}[kind]
			if n := len([]rune(attr[0].Description)); n != wantLen {
				t.Errorf("description kept %d characters, want %d", n, wantLen)
			}
			errStatus := fake.Statuses(sha2, "gradient")
			wantError := map[forge.Kind]string{forge.GitHub: "error", forge.Gitea: "error", forge.GitLab: "failed"}[kind]
			if len(errStatus) != 1 || errStatus[0].State != wantError {
				t.Fatalf("error status = %+v, want one %q", errStatus, wantError)
			}
		})
	}
}

// The outbox may post the same state again after a restart; GitLab
// refuses a repeated pending or running with 400, which counts as posted.
func TestPostStatusGitLabRepeatedStateIsPosted(t *testing.T) {
	fake := forgetest.New(t, forge.GitLab, forgetest.Options{})
	c := newClient(t, fake)
	ctx := context.Background()
	for _, s := range []forge.Status{
		{Commit: sha1, Context: "gradient", State: forge.StatePending},
		{Commit: sha1, Context: "gradient", State: forge.StatePending},
		{Commit: sha1, Context: "gradient", State: forge.StatePending, Running: true},
		{Commit: sha1, Context: "gradient", State: forge.StatePending, Running: true},
		{Commit: sha1, Context: "gradient", State: forge.StateSuccess},
	} {
		if err := c.PostStatus(ctx, s); err != nil {
			t.Fatalf("PostStatus(%s running=%v): %v", s.State, s.Running, err)
		}
	}
	var states []string
	for _, r := range fake.Statuses(sha1, "gradient") {
		states = append(states, r.State)
	}
	if strings.Join(states, ",") != "pending,running,success" {
		t.Fatalf("GitLab holds %v", states)
	}
}

// GitLab's project ID is the URL-encoded full path: group%2Fsub%2Frepo,
// one path segment.
func TestGitLabProjectPathEscaped(t *testing.T) {
	fake := forgetest.New(t, forge.GitLab, forgetest.Options{Repository: "nix/infra/deploy.tools"})
	c := newClient(t, fake)
	if err := c.PostStatus(context.Background(), forge.Status{Commit: sha1, Context: "gradient", State: forge.StateSuccess}); err != nil {
		t.Fatal(err)
	}
	want := "POST /api/v4/projects/nix%2Finfra%2Fdeploy.tools/statuses/" + sha1
	if reqs := fake.Requests(); len(reqs) != 1 || reqs[0] != want {
		t.Fatalf("requests %v, want [%s]", reqs, want)
	}
}

func TestPostStatusRefusesBadInput(t *testing.T) {
	fake := forgetest.New(t, forge.GitHub, forgetest.Options{})
	c := newClient(t, fake)
	for _, s := range []forge.Status{
		{Commit: "abc123", Context: "gradient", State: forge.StateSuccess},
		{Commit: sha1 + "/../../x", Context: "gradient", State: forge.StateSuccess},
		{Commit: sha1, Context: "", State: forge.StateSuccess},
		{Commit: sha1, Context: "gradient", State: "warning"},
		{Commit: sha1, Context: "gradient", State: forge.StateSuccess, TargetURL: "javascript:alert(1)"},
	} {
		if err := c.PostStatus(context.Background(), s); err == nil {
			t.Errorf("PostStatus(%+v) accepted", s)
		}
	}
	if reqs := fake.Requests(); len(reqs) != 0 {
		t.Fatalf("bad statuses reached the forge: %v", reqs)
	}
}

func TestCanWrite(t *testing.T) {
	perms := map[string]string{
		"owner-user": "admin", "maintainer": "maintain", "committer": "write",
		"triager": "triage", "reader": "read", "outsider": "none",
	}
	want := map[string]bool{
		"owner-user": true, "maintainer": true, "committer": true,
		"triager": false, "reader": false, "outsider": false, "ghost": false,
	}
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			fake := forgetest.New(t, kind, forgetest.Options{Permissions: perms})
			c := newClient(t, fake)
			for user, w := range want {
				got, err := c.CanWrite(context.Background(), user)
				if err != nil {
					t.Fatalf("CanWrite(%s): %v", user, err)
				}
				if got != w {
					t.Errorf("CanWrite(%s) = %v, want %v", user, got, w)
				}
			}
			fake.SetPermission("reader", "write")
			if ok, err := c.CanWrite(context.Background(), "reader"); err != nil || !ok {
				t.Errorf("CanWrite after promotion = %v, %v", ok, err)
			}
			if _, err := c.CanWrite(context.Background(), "../admin"); err == nil {
				t.Error("CanWrite accepted a user name with a slash")
			}
		})
	}
}

func TestCheck(t *testing.T) {
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			fake := forgetest.New(t, kind, forgetest.Options{})
			if err := newClient(t, fake).Check(context.Background()); err != nil {
				t.Fatalf("Check: %v", err)
			}

			ro := forgetest.New(t, kind, forgetest.Options{ReadOnly: true})
			err := newClient(t, ro).Check(context.Background())
			if err == nil || !strings.Contains(err.Error(), "can read") {
				t.Fatalf("Check with read-only credentials = %v, want an error saying it can read but not post", err)
			}

			wrong := fake.Link()
			wrong.Token = "wrong-token"
			c, err := forge.NewClient(wrong, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Check(context.Background())
			if err == nil || !strings.Contains(err.Error(), "credentials were refused") || strings.Contains(err.Error(), "wrong-token") {
				t.Fatalf("Check with a wrong token = %v", err)
			}
			var re *forge.RetryableError
			if errors.As(err, &re) {
				t.Fatalf("a refused token is retryable: %v", err)
			}
			noSecret(t, fake, err)

			missing := fake.Link()
			missing.Repository = strings.Replace(missing.Repository, "repo", "other", 1)
			c, _ = forge.NewClient(missing, nil)
			err = c.Check(context.Background())
			if err == nil || !strings.Contains(err.Error(), "missing or the credentials cannot read it") {
				t.Fatalf("Check of another repository = %v", err)
			}
			noSecret(t, fake, err)
		})
	}
}

func TestRetryableClassification(t *testing.T) {
	reset := time.Now().Add(2 * time.Minute)
	tests := []struct {
		name      string
		kind      forge.Kind
		failure   forgetest.Failure
		retryable bool
		minAfter  time.Duration
		maxAfter  time.Duration
	}{
		{"500", forge.GitHub, forgetest.Failure{Code: 500}, true, 0, 0},
		{"502 gitea", forge.Gitea, forgetest.Failure{Code: 502}, true, 0, 0},
		{"503 retry-after", forge.GitLab, forgetest.Failure{Code: 503, RetryAfter: 30 * time.Second}, true, 30 * time.Second, 30 * time.Second},
		{"429 github", forge.GitHub, forgetest.Failure{Code: 429, RetryAfter: 7 * time.Second}, true, 7 * time.Second, 7 * time.Second},
		{"429 gitea", forge.Gitea, forgetest.Failure{Code: 429, RetryAfter: 3 * time.Second}, true, 3 * time.Second, 3 * time.Second},
		{"429 gitlab", forge.GitLab, forgetest.Failure{Code: 429, RetryAfter: 60 * time.Second}, true, 60 * time.Second, 60 * time.Second},
		{"429 gitlab reset", forge.GitLab, forgetest.Failure{Code: 429, RateLimitReset: reset}, true, 100 * time.Second, 120 * time.Second},
		{"403 secondary", forge.GitHub, forgetest.Failure{Code: 403, RetryAfter: 60 * time.Second}, true, 60 * time.Second, 60 * time.Second},
		{"403 primary", forge.GitHub, forgetest.Failure{Code: 403, RateLimitReset: reset}, true, 100 * time.Second, 120 * time.Second},
		{"403 plain", forge.GitHub, forgetest.Failure{Code: 403}, false, 0, 0},
		{"403 gitea", forge.Gitea, forgetest.Failure{Code: 403, RetryAfter: time.Second}, false, 0, 0},
		{"422", forge.GitHub, forgetest.Failure{Code: 422}, false, 0, 0},
		{"404", forge.GitLab, forgetest.Failure{Code: 404}, false, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := forgetest.New(t, tt.kind, forgetest.Options{})
			c := newClient(t, fake)
			fake.FailNext(1, tt.failure)
			s := forge.Status{Commit: sha1, Context: "gradient", State: forge.StateSuccess}
			err := c.PostStatus(context.Background(), s)
			if err == nil {
				t.Fatal("PostStatus succeeded through a failure")
			}
			noSecret(t, fake, err)
			var re *forge.RetryableError
			if errors.As(err, &re) != tt.retryable {
				t.Fatalf("retryable = %v, want %v: %v", !tt.retryable, tt.retryable, err)
			}
			if re != nil && (re.After < tt.minAfter || re.After > tt.maxAfter) {
				t.Fatalf("After = %v, want within [%v, %v]", re.After, tt.minAfter, tt.maxAfter)
			}
			// The failure was one request: the retry goes through.
			if err := c.PostStatus(context.Background(), s); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if got := fake.Statuses(sha1, "gradient"); len(got) != 1 {
				t.Fatalf("received %d statuses, want 1", len(got))
			}
		})
	}
}

func TestNetworkErrorIsRetryable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c, err := forge.NewClient(forge.Link{Kind: forge.Gitea, APIURL: url, Repository: "o/r", Token: "secret-token"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.PostStatus(context.Background(), forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending})
	var re *forge.RetryableError
	if !errors.As(err, &re) || re.After != 0 {
		t.Fatalf("PostStatus to a closed port = %v, want a RetryableError with no After", err)
	}
	if strings.Contains(err.Error(), "secret-token") {
		t.Fatalf("error shows the token: %v", err)
	}
}

// A redirect is not followed: it could carry GitLab's PRIVATE-TOKEN
// header, which Go's client forwards to any host, elsewhere.
func TestRedirectNotFollowed(t *testing.T) {
	var leaked atomic.Bool
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("PRIVATE-TOKEN") != "" {
			leaked.Store(true)
		}
	}))
	defer elsewhere.Close()
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusMovedPermanently)
	}))
	defer redirector.Close()
	c, err := forge.NewClient(forge.Link{Kind: forge.GitLab, APIURL: redirector.URL, Repository: "g/r", Token: "glpat-secret"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.PostStatus(context.Background(), forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending})
	if err == nil || !strings.Contains(err.Error(), "redirected to") {
		t.Fatalf("PostStatus through a redirect = %v", err)
	}
	if leaked.Load() {
		t.Fatal("the token followed the redirect")
	}
}

func TestGitHubAppTokenExchangeAndCache(t *testing.T) {
	app := forgetest.NewApp(t, 31337)
	fake := forgetest.New(t, forge.GitHub, forgetest.Options{App: app, Permissions: map[string]string{"committer": "write"}})
	c := newClient(t, fake)
	ctx := context.Background()
	if err := c.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	for i := 0; i < 3; i++ {
		if err := c.PostStatus(ctx, forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending}); err != nil {
			t.Fatalf("PostStatus: %v", err)
		}
	}
	if ok, err := c.CanWrite(ctx, "committer"); err != nil || !ok {
		t.Fatalf("CanWrite = %v, %v", ok, err)
	}
	if n := fake.TokenExchanges(); n != 1 {
		t.Fatalf("%d token exchanges for five calls, want 1 (cached)", n)
	}
	if n := len(fake.Statuses(sha1, "gradient")); n != 3 {
		t.Fatalf("%d statuses received, want 3", n)
	}

	// A revoked token answers 401: the cache is dropped and the call
	// goes through with a new token.
	fake.RevokeAppTokens()
	if err := c.PostStatus(ctx, forge.Status{Commit: sha1, Context: "gradient", State: forge.StateSuccess}); err != nil {
		t.Fatalf("PostStatus after revocation: %v", err)
	}
	if n := fake.TokenExchanges(); n != 2 {
		t.Fatalf("%d token exchanges after revocation, want 2", n)
	}
}

// A token that expires within the refresh margin is never reused.
func TestGitHubAppTokenRefreshedNearExpiry(t *testing.T) {
	app := forgetest.NewApp(t, 7)
	fake := forgetest.New(t, forge.GitHub, forgetest.Options{App: app, TokenLifetime: 4 * time.Minute})
	c := newClient(t, fake)
	for i := 0; i < 3; i++ {
		if err := c.PostStatus(context.Background(), forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending}); err != nil {
			t.Fatal(err)
		}
	}
	if n := fake.TokenExchanges(); n != 3 {
		t.Fatalf("%d exchanges for three calls with 4-minute tokens, want 3", n)
	}
}

func TestGitHubAppRefusals(t *testing.T) {
	app := forgetest.NewApp(t, 99)
	ctx := context.Background()

	// A key that is not the App's: GitHub refuses the JWT.
	fake := forgetest.New(t, forge.GitHub, forgetest.Options{App: app})
	impostor := fake.Link()
	impostor.App = forgetest.NewApp(t, 99)
	c, err := forge.NewClient(impostor, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "refused the App's JWT") || strings.Contains(err.Error(), "PRIVATE KEY") {
		t.Fatalf("Check with another key = %v", err)
	}

	// Another repository: the App is not installed there.
	other := fake.Link()
	other.Repository = "owner/elsewhere"
	c, _ = forge.NewClient(other, nil)
	if err := c.Check(ctx); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("Check of a repository without the App = %v", err)
	}

	// An installation with statuses: read.
	ro := forgetest.New(t, forge.GitHub, forgetest.Options{App: app, ReadOnly: true})
	c, _ = forge.NewClient(ro.Link(), nil)
	if err := c.Check(ctx); err == nil || !strings.Contains(err.Error(), "Commit statuses") {
		t.Fatalf("Check of a read-only installation = %v", err)
	}
}

// Concurrent calls share one installation token and the fake's records
// stay whole (run with -race).
func TestConcurrentPostsShareOneToken(t *testing.T) {
	app := forgetest.NewApp(t, 5)
	fake := forgetest.New(t, forge.GitHub, forgetest.Options{App: app})
	c := newClient(t, fake)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.PostStatus(context.Background(), forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := fake.TokenExchanges(); n != 1 {
		t.Fatalf("%d exchanges for 16 concurrent calls, want 1", n)
	}
	if n := len(fake.Statuses(sha1, "gradient")); n != 16 {
		t.Fatalf("%d statuses, want 16", n)
	}
}

func TestNewClientRefusesInvalidLink(t *testing.T) {
	if _, err := forge.NewClient(forge.Link{Kind: forge.GitHub, APIURL: "http://example.com", Repository: "o/r", Token: "t"}, nil); err == nil {
		t.Fatal("NewClient accepted plain http to a remote host")
	}
}

// GitHub Enterprise's API lives under /api/v3: the client keeps the
// base URL's path.
func TestGitHubEnterprisePathPrefix(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Method + " " + r.URL.Path + " " + r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c, err := forge.NewClient(forge.Link{Kind: forge.GitHub, APIURL: srv.URL + "/api/v3/", Repository: "org/repo", Token: "ghp_x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PostStatus(context.Background(), forge.Status{Commit: sha1, Context: "gradient", State: forge.StateSuccess}); err != nil {
		t.Fatal(err)
	}
	if want := "POST /api/v3/repos/org/repo/statuses/" + sha1 + " Bearer ghp_x"; got.Load() != want {
		t.Fatalf("request %q, want %q", got.Load(), want)
	}
}

// A caller's cancelled context is not the forge's refusal: the status
// stays to be posted.
func TestCancelledContextIsRetryable(t *testing.T) {
	fake := forgetest.New(t, forge.Gitea, forgetest.Options{})
	c := newClient(t, fake)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.PostStatus(ctx, forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending})
	var re *forge.RetryableError
	if !errors.As(err, &re) || !errors.Is(err, context.Canceled) {
		t.Fatalf("PostStatus with a cancelled context = %v", err)
	}
}

// Gitea lets only a repository's admins read other users' permissions:
// a token without that is an error, not "no write access".
func TestGiteaCanWriteNeedsAdminToken(t *testing.T) {
	fake := forgetest.New(t, forge.Gitea, forgetest.Options{ReadOnly: true, Permissions: map[string]string{"committer": "write"}})
	_, err := newClient(t, fake).CanWrite(context.Background(), "committer")
	if err == nil || !strings.Contains(err.Error(), "repository admin") {
		t.Fatalf("CanWrite with a non-admin token = %v", err)
	}
}

// A token's scopes, not only its user's access, must allow statuses.
func TestCheckTokenScopes(t *testing.T) {
	ctx := context.Background()
	gh := forgetest.New(t, forge.GitHub, forgetest.Options{Scopes: []string{"read:org", "gist"}})
	if err := newClient(t, gh).Check(ctx); err == nil || !strings.Contains(err.Error(), "repo:status") {
		t.Fatalf("Check of a classic token without repo scopes = %v", err)
	}
	status := forgetest.New(t, forge.GitHub, forgetest.Options{Scopes: []string{"repo:status"}})
	if err := newClient(t, status).Check(ctx); err != nil {
		t.Fatalf("Check of a repo:status token: %v", err)
	}
	fineGrained := forgetest.New(t, forge.GitHub, forgetest.Options{Scopes: []string{}})
	if err := newClient(t, fineGrained).Check(ctx); err != nil {
		t.Fatalf("Check of a fine-grained token: %v", err)
	}
	gl := forgetest.New(t, forge.GitLab, forgetest.Options{Scopes: []string{"read_api", "read_repository"}})
	if err := newClient(t, gl).Check(ctx); err == nil || !strings.Contains(err.Error(), "api scope") {
		t.Fatalf("Check of a read_api GitLab token = %v", err)
	}
}

// Gitea's and GitLab's links take the host root; the API root pasted
// instead reaches the same endpoints.
func TestAPIRootPastedInstead(t *testing.T) {
	for kind, suffix := range map[forge.Kind]string{forge.Gitea: "/api/v1", forge.GitLab: "/api/v4/"} {
		fake := forgetest.New(t, kind, forgetest.Options{})
		l := fake.Link()
		l.APIURL += suffix
		c, err := forge.NewClient(l, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Check(context.Background()); err != nil {
			t.Errorf("%s with the API root: %v", kind, err)
		}
	}
}

// After a revocation, concurrent calls that all met the refused token
// share one new token.
func TestRevokedTokenReplacedOnceForConcurrentCalls(t *testing.T) {
	app := forgetest.NewApp(t, 11)
	fake := forgetest.New(t, forge.GitHub, forgetest.Options{App: app})
	c := newClient(t, fake)
	if err := c.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	fake.RevokeAppTokens()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.PostStatus(context.Background(), forge.Status{Commit: sha1, Context: "gradient", State: forge.StatePending}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := fake.TokenExchanges(); n != 2 {
		t.Fatalf("%d exchanges, want 2 (the first and one after the revocation)", n)
	}
}
