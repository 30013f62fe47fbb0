// Package forgetest fakes the forges' REST APIs at the HTTP level, as
// their documentation describes the calls package forge makes (commit
// statuses, repository reads, collaborator permissions, GitHub App
// installation tokens), and builds signed webhook deliveries, so tests
// drive the real client and the real webhook endpoints.
package forgetest

import (
	"net/http"
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
	// installation tokens.
	App *forge.GitHubApp
	// ReadOnly: the credentials may read the repository but not post
	// statuses (Check must say so; statuses answer 403 / 404).
	ReadOnly bool
	// Permissions maps user names to their permission on the repository:
	// "admin", "maintain", "write", "triage", "read" (GitHub's names; the
	// fake answers each kind in its own terms: Gitea's permission, GitLab's
	// access level). Users not listed are not collaborators.
	Permissions map[string]string
	// TokenLifetime is how long App installation tokens live; default 1 h.
	TokenLifetime time.Duration
}

// Received is a status as the fake forge recorded it, in that forge's
// words (GitLab: "pending", "running", "success", "failed").
type Received struct {
	Commit      string
	Context     string
	State       string
	Description string
	TargetURL   string
}

// Failure is what the next requests are answered with instead.
type Failure struct {
	// Code is the HTTP status: 500, 429, or 403 for GitHub's secondary
	// rate limit.
	Code int
	// RetryAfter, when positive, is sent as Retry-After in seconds.
	RetryAfter time.Duration
	// RateLimitReset, when set, sends x-ratelimit-remaining: 0 and
	// x-ratelimit-reset with this time (GitHub's primary limit).
	RateLimitReset time.Time
}

// Server is a fake forge of one kind serving one repository.
type Server struct {
	Kind       forge.Kind
	Repository string
	Token      string
}

// New starts a fake forge, closed when t ends.
func New(t testing.TB, kind forge.Kind, opt Options) *Server {
	t.Helper()
	t.Fatal("forgetest: not implemented yet")
	return nil
}

// URL is the API base a Link takes (for GitHub the API root, for Gitea and
// GitLab the host root the client appends /api/v1 or /api/v4 to).
func (s *Server) URL() string { return "" }

// Link is a link to the fake's repository with its token, or with its
// App when one was given.
func (s *Server) Link() forge.Link { return forge.Link{} }

// Statuses are the statuses received for (commit, context), in order.
func (s *Server) Statuses(commit, context string) []Received { return nil }

// AllStatuses are all statuses received, in order.
func (s *Server) AllStatuses() []Received { return nil }

// SetPermission sets user's permission (see Options.Permissions); "" removes it.
func (s *Server) SetPermission(user, permission string) {}

// FailNext answers the next n API requests with f.
func (s *Server) FailNext(n int, f Failure) {}

// TokenExchanges counts App installation tokens handed out.
func (s *Server) TokenExchanges() int { return 0 }

// RevokeAppTokens makes every installation token handed out so far
// invalid (answered 401), as when GitHub revokes or expires them.
func (s *Server) RevokeAppTokens() {}

// NewApp makes a GitHub App identity with a fresh RSA key (PKCS#1 PEM, as
// GitHub hands them out).
func NewApp(t testing.TB, appID int64) *forge.GitHubApp {
	t.Helper()
	t.Fatal("forgetest: not implemented yet")
	return nil
}

// PushDelivery is a signed push of sha to branch, with a fresh delivery ID.
func PushDelivery(kind forge.Kind, secret []byte, repo, branch, sha string) (http.Header, []byte) {
	return http.Header{}, nil
}

// PRDelivery is a signed pull (merge) request event by "contributor",
// with a fresh delivery ID. fromFork puts the head in "contributor/<name>"
// (GitLab: another project ID).
func PRDelivery(kind forge.Kind, secret []byte, repo string, number int, action forge.PRAction, head, base string, fromFork bool) (http.Header, []byte) {
	return http.Header{}, nil
}

// CommentDelivery is a signed new comment on pull (merge) request number,
// with a fresh delivery ID.
func CommentDelivery(kind forge.Kind, secret []byte, repo string, number int, author, body string) (http.Header, []byte) {
	return http.Header{}, nil
}

// PingDelivery is the signed event a forge sends when a webhook is
// created or tested (GitHub ping; Gitea and GitLab send a push test).
func PingDelivery(kind forge.Kind, secret []byte, repo string) (http.Header, []byte) {
	return http.Header{}, nil
}
