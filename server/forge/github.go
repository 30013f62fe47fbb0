package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"gradient.dev/gradient/gitsource"
)

// gitHub is the REST API v3 client of github.com and GitHub Enterprise.
type gitHub struct {
	api         *apiClient
	owner, name string
	app         *appTokens // nil with a token
}

// gitHubDescriptionLimit is what GitHub keeps of a status description.
const gitHubDescriptionLimit = 140

func (g *gitHub) repoPath() string {
	return "/repos/" + url.PathEscape(g.owner) + "/" + url.PathEscape(g.name)
}

// PostStatus: POST /repos/{owner}/{repo}/statuses/{sha}.
func (g *gitHub) PostStatus(ctx context.Context, s Status) error {
	body, err := hubStatusBody(s, gitHubDescriptionLimit)
	if err != nil {
		return err
	}
	return g.api.call(ctx, http.MethodPost, g.repoPath()+"/statuses/"+url.PathEscape(s.Commit), body, nil)
}

// hubStatusBody is the status request GitHub and Gitea share.
func hubStatusBody(s Status, descriptionLimit int) (map[string]string, error) {
	if err := checkStatus(s); err != nil {
		return nil, err
	}
	body := map[string]string{"state": string(s.State), "context": s.Context}
	if s.Description != "" {
		body["description"] = truncate(s.Description, descriptionLimit)
	}
	if s.TargetURL != "" {
		body["target_url"] = s.TargetURL
	}
	return body, nil
}

func checkStatus(s Status) error {
	if err := gitsource.ValidateCommit(s.Commit); err != nil {
		return fmt.Errorf("forge: status: %w", err)
	}
	switch s.State {
	case StatePending, StateSuccess, StateFailure, StateError:
	default:
		return fmt.Errorf("forge: status: unknown state %q", s.State)
	}
	if s.Context == "" {
		return errors.New("forge: status: the context is empty")
	}
	if s.TargetURL != "" {
		u, err := url.Parse(s.TargetURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("forge: status: target URL %q is not an http(s) URL", s.TargetURL)
		}
	}
	return nil
}

// CanWrite: GET /repos/{owner}/{repo}/collaborators/{user}/permission.
// "permission" folds maintain into write and triage into read;
// role_name keeps them (and custom roles, which count only when their
// base permission is write or more).
func (g *gitHub) CanWrite(ctx context.Context, user string) (bool, error) {
	if err := checkUser(user); err != nil {
		return false, err
	}
	var p struct {
		Permission string `json:"permission"`
		RoleName   string `json:"role_name"`
	}
	err := g.api.call(ctx, http.MethodGet, g.repoPath()+"/collaborators/"+url.PathEscape(user)+"/permission", nil, &p)
	if statusOf(err) == http.StatusNotFound {
		return false, nil // no such user
	}
	if err != nil {
		return false, err
	}
	switch p.Permission {
	case "admin", "write":
		return true, nil
	}
	return p.RoleName == "maintain", nil
}

// Check reads the repository and confirms the credentials may post
// statuses: a token's permissions.push (classic tokens; a fine-grained
// token needs Contents: write to show push), an App installation
// token's statuses: write.
func (g *gitHub) Check(ctx context.Context) error {
	if g.app != nil {
		perms, err := g.app.permissions(ctx)
		if err != nil {
			return err
		}
		if perms["statuses"] != "write" {
			return fmt.Errorf("forge: the GitHub App's installation has statuses: %q; it needs Commit statuses: Read and write", perms["statuses"])
		}
	}
	var repo gitHubRepo
	if err := g.api.call(ctx, http.MethodGet, g.repoPath(), nil, &repo); err != nil {
		return explainRead(err)
	}
	if g.app != nil {
		return nil
	}
	if repo.Permissions == nil || !repo.Permissions.Push {
		return errors.New("forge: the token can read the repository but has no push access, which posting statuses needs (classic token: repo or repo:status scope; fine-grained: Commit statuses and Contents read and write)")
	}
	// A classic token names its scopes; the user's push access is not
	// the token's. Fine-grained tokens send no X-OAuth-Scopes.
	if scopes, ok := repo.header["X-Oauth-Scopes"]; ok {
		have := map[string]bool{}
		for _, s := range strings.Split(strings.Join(scopes, ","), ",") {
			have[strings.TrimSpace(s)] = true
		}
		if !have["repo"] && !have["repo:status"] {
			return fmt.Errorf("forge: the classic token has scopes %q; posting statuses needs repo or repo:status", strings.Join(scopes, ","))
		}
	}
	return nil
}

// gitHubRepo is the part of GET /repos/{owner}/{repo} Check reads, with
// the answer's headers.
type gitHubRepo struct {
	Permissions *struct {
		Push bool `json:"push"`
	} `json:"permissions"`
	header http.Header
}

func (r *gitHubRepo) receiveHeader(h http.Header) { r.header = h }

// explainRead says what a failed read of the repository means.
func explainRead(err error) error {
	switch statusOf(err) {
	case http.StatusUnauthorized:
		return fmt.Errorf("forge: the credentials were refused: %w", err)
	case http.StatusNotFound, http.StatusForbidden:
		return fmt.Errorf("forge: the repository is missing or the credentials cannot read it: %w", err)
	}
	return err
}
