package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
)

// gitea is the API v1 client of Gitea and Forgejo.
type gitea struct {
	api         *apiClient
	owner, name string
}

func (g *gitea) repoPath() string {
	return "/repos/" + url.PathEscape(g.owner) + "/" + url.PathEscape(g.name)
}

// giteaDescriptionLimit keeps descriptions as short as GitHub's would be
// on a forge whose column has no documented limit.
const giteaDescriptionLimit = 255

// PostStatus: POST /api/v1/repos/{owner}/{repo}/statuses/{sha}.
func (g *gitea) PostStatus(ctx context.Context, s Status) error {
	body, err := hubStatusBody(s, giteaDescriptionLimit)
	if err != nil {
		return err
	}
	return g.api.call(ctx, http.MethodPost, g.repoPath()+"/statuses/"+url.PathEscape(s.Commit), body, nil)
}

// CanWrite: GET /api/v1/repos/{owner}/{repo}/collaborators/{user}/permission,
// whose permission is none, read, write, admin or owner; 404 for a user
// that does not exist. Gitea answers 403 unless the token's user
// administers the repository (or the instance): that is an error saying so.
func (g *gitea) CanWrite(ctx context.Context, user string) (bool, error) {
	if err := checkUser(user); err != nil {
		return false, err
	}
	var p struct {
		Permission string `json:"permission"`
	}
	err := g.api.call(ctx, http.MethodGet, g.repoPath()+"/collaborators/"+url.PathEscape(user)+"/permission", nil, &p)
	switch statusOf(err) {
	case http.StatusNotFound:
		return false, nil
	case http.StatusForbidden:
		return false, fmt.Errorf("forge: reading another user's permission needs a token of a repository admin: %w", err)
	}
	if err != nil {
		return false, err
	}
	switch p.Permission {
	case "write", "admin", "owner":
		return true, nil
	}
	return false, nil
}

// Check reads the repository; posting a status needs write access to it.
func (g *gitea) Check(ctx context.Context) error {
	var repo struct {
		Permissions *struct {
			Push bool `json:"push"`
		} `json:"permissions"`
	}
	if err := g.api.call(ctx, http.MethodGet, g.repoPath(), nil, &repo); err != nil {
		return explainRead(err)
	}
	if repo.Permissions == nil || !repo.Permissions.Push {
		return errors.New("forge: the token can read the repository but has no write access, which posting statuses needs (token scope write:repository and a collaborator with write)")
	}
	return nil
}
