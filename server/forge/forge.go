// Package forge speaks to the forges a project's repository lives on —
// GitHub (github.com, Enterprise, GitHub Apps), Gitea and Forgejo, GitLab:
// it verifies and parses their webhook deliveries and posts commit
// statuses through their REST APIs. It knows no storage and no server:
// a Link arrives with its credentials already opened, deliveries arrive
// as headers and a bounded body.
package forge

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Kind is a forge's API family.
type Kind string

// The forge kinds. Forgejo speaks Gitea's API and webhooks, so it is Gitea.
const (
	GitHub Kind = "github"
	Gitea  Kind = "gitea"
	GitLab Kind = "gitlab"
)

// ParseKind reads a kind as an operator writes it; "forgejo" is Gitea.
func ParseKind(s string) (Kind, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "github":
		return GitHub, nil
	case "gitea", "forgejo":
		return Gitea, nil
	case "gitlab":
		return GitLab, nil
	}
	return "", fmt.Errorf("forge: unknown kind %q (want github, gitea, forgejo or gitlab)", s)
}

// Link is a project's forge link with its credentials opened.
type Link struct {
	Kind Kind
	// APIURL is the API's base. GitHub: https://api.github.com or
	// https://HOST/api/v3 (Enterprise); Gitea: https://HOST (the client
	// appends /api/v1); GitLab: https://HOST (the client appends /api/v4).
	APIURL string
	// Repository is "owner/name"; on GitLab it may have subgroups:
	// "group/sub/name".
	Repository string
	// Token is a personal, project or repository access token; empty when
	// App is set.
	Token string
	// App authenticates as a GitHub App installed on the repository.
	App *GitHubApp
}

// GitHubApp is a GitHub App's identity: its ID and its private key in PEM
// (PKCS#1 "RSA PRIVATE KEY", as GitHub hands it out, or PKCS#8).
type GitHubApp struct {
	AppID         int64
	PrivateKeyPEM []byte
}

// maxRepositoryLength bounds a repository path; GitLab allows 20 levels
// of groups, every forge far less than this in bytes.
const maxRepositoryLength = 512

// Validate checks a link before it is stored or used: a known kind, an
// https API URL (http only to a loopback host, for tests and local
// forges), a repository of the kind's shape, exactly one credential, and
// an App only on GitHub. Its errors never contain the credentials.
func (l Link) Validate() error {
	switch l.Kind {
	case GitHub, Gitea, GitLab:
	default:
		return fmt.Errorf("forge: unknown kind %q", l.Kind)
	}
	if err := validateAPIURL(l.APIURL); err != nil {
		return err
	}
	if err := validateRepository(l.Kind, l.Repository); err != nil {
		return err
	}
	switch {
	case l.Token != "" && l.App != nil:
		return errors.New("forge: give either a token or a GitHub App, not both")
	case l.Token == "" && l.App == nil:
		return errors.New("forge: a token or a GitHub App is required")
	case l.App != nil && l.Kind != GitHub:
		return fmt.Errorf("forge: a GitHub App works only with kind github, not %s", l.Kind)
	case l.App != nil:
		if l.App.AppID <= 0 {
			return errors.New("forge: the GitHub App ID must be a positive number")
		}
		if _, err := parsePrivateKey(l.App.PrivateKeyPEM); err != nil {
			return err
		}
	case strings.ContainsAny(l.Token, " \t\r\n"):
		// A header value cannot carry these; say so without echoing it.
		return errors.New("forge: the token contains white space")
	}
	return nil
}

func validateAPIURL(raw string) error {
	if raw == "" {
		return errors.New("forge: the API URL is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("forge: API URL: %v", err)
	}
	if u.User != nil {
		return errors.New("forge: the API URL must not carry credentials")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return errors.New("forge: the API URL must have no query or fragment")
	}
	if u.Host == "" {
		return fmt.Errorf("forge: API URL %q has no host", raw)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !isLoopback(u.Hostname()) {
			return fmt.Errorf("forge: API URL %q: http only to a loopback host; use https", raw)
		}
	default:
		return fmt.Errorf("forge: API URL %q: scheme must be https", raw)
	}
	return nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func validateRepository(k Kind, repo string) error {
	if repo == "" {
		return errors.New("forge: the repository is required")
	}
	if len(repo) > maxRepositoryLength {
		return fmt.Errorf("forge: the repository is longer than %d bytes", maxRepositoryLength)
	}
	parts := strings.Split(repo, "/")
	if k != GitLab && len(parts) != 2 {
		return fmt.Errorf("forge: repository %q must be owner/name", repo)
	}
	if len(parts) < 2 {
		return fmt.Errorf("forge: repository %q must be group/name (subgroups allowed)", repo)
	}
	for _, p := range parts {
		if !validPathSegment(p) {
			return fmt.Errorf("forge: repository %q: segment %q is not a valid name", repo, p)
		}
	}
	return nil
}

// validPathSegment accepts the characters every forge allows in owner,
// group and repository names (letters, digits, '-', '_', '.'), not "."
// or "..", so a segment can never climb out of its API path.
func validPathSegment(s string) bool {
	if s == "" || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// DefaultAPIURL is the API base of a kind's public instance: GitHub's;
// Gitea and GitLab hosts must always be given.
func DefaultAPIURL(k Kind) string {
	if k == GitHub {
		return "https://api.github.com"
	}
	return ""
}
