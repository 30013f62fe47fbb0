// Package forgetest fakes the forges' REST APIs at the HTTP level, as
// their documentation describes the calls package forge makes (commit
// statuses, repository reads, collaborator permissions and memberships,
// GitHub App installation tokens, authentication failures, rate-limit
// headers), and builds signed webhook deliveries, so tests drive the
// real client and the real webhook endpoints.
package forgetest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/server/forge"
)

// Options shape a fake forge.
type Options struct {
	// Repository is the one repository the fake hosts; default
	// "owner/repo" ("group/sub/repo" on GitLab).
	Repository string
	// Token is the access token the fake accepts; default a random one.
	Token string
	// App, on GitHub, is an App installed on the repository: the fake
	// verifies its JWTs with the key's public half and hands out
	// installation tokens. Link then returns the App, not the token.
	App *forge.GitHubApp
	// ReadOnly: the credentials may read the repository but not post
	// statuses (GitHub and Gitea show no push permission and answer 403,
	// GitLab shows Reporter access and answers 403; an App installation
	// has statuses: read). Otherwise a Gitea token is the repository's
	// admin, which Gitea requires to read other users' permissions.
	ReadOnly bool
	// Permissions maps user names to their permission on the repository
	// in GitHub's words: "admin", "maintain", "write", "triage", "read",
	// "none". Each kind answers in its own terms (Gitea's permission,
	// GitLab's access level). Users not listed do not exist.
	Permissions map[string]string
	// TokenLifetime is how long App installation tokens live; default 1 h
	// as on GitHub.
	TokenLifetime time.Duration
	// Scopes are the token's scopes: GitHub's classic scopes, sent as
	// X-OAuth-Scopes (default "repo"); GitLab's, answered by
	// /personal_access_tokens/self (default "api"). Nil for the default;
	// empty, on GitHub, for a fine-grained token (no header).
	Scopes []string
}

// Received is a status as the fake forge recorded it, in that forge's
// words (GitLab: "pending", "running", "success", "failed", "canceled").
type Received struct {
	Commit      string
	Context     string
	State       string
	Description string
	TargetURL   string
}

// Failure is what the next requests are answered with instead.
type Failure struct {
	// Code is the HTTP status: 500, 502, 429, or 403 for GitHub's
	// secondary rate limit.
	Code int
	// RetryAfter, when positive, is sent as Retry-After in seconds.
	RetryAfter time.Duration
	// RateLimitReset, when set, sends x-ratelimit-remaining: 0 and
	// x-ratelimit-reset with this time (GitHub's primary limit; GitLab's
	// RateLimit-* headers).
	RateLimitReset time.Time
}

// The fake's fixed IDs.
const (
	// InstallationID is the fake App installation's ID on GitHub.
	InstallationID = 4242
	// projectID is the GitLab project's numeric ID.
	projectID = 77
)

// Server is a fake forge of one kind serving one repository. Its methods
// are safe for concurrent use.
type Server struct {
	Kind       forge.Kind
	Repository string
	Token      string

	srv      *httptest.Server
	app      *forge.GitHubApp
	appKey   *appKey
	readOnly bool
	lifetime time.Duration
	scopes   []string

	mu          sync.Mutex
	perms       map[string]string
	statuses    []Received
	fail        []Failure
	appTokens   map[string]time.Time // installation token → expiry
	exchanges   int
	requests    []string
	remaining   int
	nextStateID int
}

// New starts a fake forge, closed when t ends.
func New(t testing.TB, kind forge.Kind, opt Options) *Server {
	t.Helper()
	s := &Server{
		Kind:       kind,
		Repository: opt.Repository,
		Token:      opt.Token,
		app:        opt.App,
		readOnly:   opt.ReadOnly,
		lifetime:   opt.TokenLifetime,
		scopes:     opt.Scopes,
		perms:      map[string]string{},
		appTokens:  map[string]time.Time{},
		remaining:  5000,
	}
	if s.Repository == "" {
		s.Repository = "owner/repo"
		if kind == forge.GitLab {
			s.Repository = "group/sub/repo"
		}
	}
	if s.Token == "" {
		s.Token = randomHex(20)
	}
	if s.lifetime == 0 {
		s.lifetime = time.Hour
	}
	if s.scopes == nil {
		switch kind {
		case forge.GitHub:
			s.scopes = []string{"repo"}
		case forge.GitLab:
			s.scopes = []string{"api"}
		}
	}
	for u, p := range opt.Permissions {
		s.perms[u] = p
	}
	if s.app != nil {
		if kind != forge.GitHub {
			t.Fatalf("forgetest: an App only on GitHub, not %s", kind)
		}
		k, err := publicKeyOf(s.app)
		if err != nil {
			t.Fatalf("forgetest: %v", err)
		}
		s.appKey = k
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

// URL is the API base a Link takes: for GitHub the API root (as
// https://HOST/api/v3 on Enterprise), for Gitea and GitLab the host root
// the client appends /api/v1 or /api/v4 to.
func (s *Server) URL() string { return s.srv.URL }

// Link is a link to the fake's repository with its token, or with its
// App when one was given.
func (s *Server) Link() forge.Link {
	l := forge.Link{Kind: s.Kind, APIURL: s.URL(), Repository: s.Repository}
	if s.app != nil {
		l.App = s.app
	} else {
		l.Token = s.Token
	}
	return l
}

// Statuses are the statuses received for (commit, context), in order.
func (s *Server) Statuses(commit, context string) []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Received
	for _, r := range s.statuses {
		if strings.EqualFold(r.Commit, commit) && r.Context == context {
			out = append(out, r)
		}
	}
	return out
}

// SetPermission sets user's permission (see Options.Permissions); ""
// makes the user unknown.
func (s *Server) SetPermission(user, permission string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if permission == "" {
		delete(s.perms, user)
		return
	}
	s.perms[user] = permission
}

// FailNext answers the next n API requests with f.
func (s *Server) FailNext(n int, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.fail = append(s.fail, f)
	}
}

// TokenExchanges counts App installation tokens handed out.
func (s *Server) TokenExchanges() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exchanges
}

// RevokeAppTokens makes every installation token handed out so far
// invalid (answered 401), as when GitHub revokes or expires them.
func (s *Server) RevokeAppTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.appTokens)
}

// Requests are the API requests received, "METHOD /escaped/path", in order.
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	path := r.URL.EscapedPath()
	s.mu.Lock()
	s.requests = append(s.requests, r.Method+" "+path)
	var fail *Failure
	if len(s.fail) > 0 {
		f := s.fail[0]
		s.fail = s.fail[1:]
		fail = &f
	}
	if s.remaining > 0 {
		s.remaining--
	}
	remaining := s.remaining
	s.mu.Unlock()

	reset := time.Now().Add(time.Hour).Unix()
	if s.Kind == forge.GitLab {
		w.Header().Set("RateLimit-Limit", "2000")
		w.Header().Set("RateLimit-Remaining", strconv.Itoa(remaining))
		w.Header().Set("RateLimit-Reset", strconv.FormatInt(reset, 10))
	} else if s.Kind == forge.GitHub {
		w.Header().Set("X-RateLimit-Limit", "5000")
		w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
		w.Header().Set("X-RateLimit-Resource", "core")
	}
	if fail != nil {
		s.answerFailure(w, *fail)
		return
	}
	switch s.Kind {
	case forge.GitHub:
		s.serveGitHub(w, r, path, body)
	case forge.Gitea:
		rest, ok := strings.CutPrefix(path, "/api/v1")
		if !ok {
			s.notFound(w)
			return
		}
		s.serveGitea(w, r, rest, body)
	case forge.GitLab:
		rest, ok := strings.CutPrefix(path, "/api/v4")
		if !ok {
			s.notFound(w)
			return
		}
		s.serveGitLab(w, r, rest, body)
	}
}

func (s *Server) answerFailure(w http.ResponseWriter, f Failure) {
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((f.RetryAfter+time.Second-1)/time.Second)))
	}
	if !f.RateLimitReset.IsZero() {
		if s.Kind == forge.GitLab {
			w.Header().Set("RateLimit-Remaining", "0")
			w.Header().Set("RateLimit-Reset", strconv.FormatInt(f.RateLimitReset.Unix(), 10))
		} else {
			w.Header().Set("X-RateLimit-Remaining", "0")
			w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(f.RateLimitReset.Unix(), 10))
		}
	}
	msg := http.StatusText(f.Code)
	switch {
	case f.Code == http.StatusForbidden && s.Kind == forge.GitHub && f.RateLimitReset.IsZero():
		msg = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."
	case f.Code == http.StatusForbidden && s.Kind == forge.GitHub:
		msg = "API rate limit exceeded for installation."
	case f.Code == http.StatusTooManyRequests && s.Kind == forge.GitLab:
		msg = "Retry later"
	}
	writeJSON(w, f.Code, map[string]string{"message": msg})
}

// sameRepo compares a path's owner/name with the hosted repository:
// GitHub's and Gitea's names are case-insensitive, GitLab's paths too.
func (s *Server) sameRepo(repo string) bool { return strings.EqualFold(repo, s.Repository) }

func (s *Server) notFound(w http.ResponseWriter) {
	msg := "Not Found"
	if s.Kind == forge.GitLab {
		msg = "404 Not found"
	}
	writeJSON(w, http.StatusNotFound, map[string]string{"message": msg})
}

func (s *Server) unauthorized(w http.ResponseWriter) {
	msg := "Bad credentials"
	switch s.Kind {
	case forge.Gitea:
		msg = "token is required"
	case forge.GitLab:
		msg = "401 Unauthorized"
	}
	writeJSON(w, http.StatusUnauthorized, map[string]string{"message": msg})
}

// record keeps a received status (with mu not held).
func (s *Server) record(r Received) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.statuses = append(s.statuses, r)
}

func (s *Server) permission(user string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for u, p := range s.perms {
		if strings.EqualFold(u, user) {
			return p, true
		}
	}
	return "", false
}

// statusRequest reads a status request's body: JSON, or a form as GitLab
// also accepts.
func statusRequest(r *http.Request, body []byte) (map[string]string, error) {
	m := map[string]string{}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		var raw map[string]any
		if err := json.Unmarshal(body, &raw); err != nil {
			return nil, err
		}
		for k, v := range raw {
			str, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("%s is not a string", k)
			}
			m[k] = str
		}
		return m, nil
	}
	if err := r.ParseForm(); err != nil {
		return nil, err
	}
	for k := range r.Form {
		m[k] = r.Form.Get(k)
	}
	return m, nil
}

func validSHA(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// bearer is the credential of an Authorization header in the forms
// forges accept: "Bearer X" or "token X".
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	for _, p := range []string{"Bearer ", "bearer ", "token ", "Token "} {
		if v, ok := strings.CutPrefix(h, p); ok {
			return v
		}
	}
	return ""
}
