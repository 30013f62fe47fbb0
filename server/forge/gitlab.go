package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// gitLab is the API v4 client of GitLab.
type gitLab struct {
	api     *apiClient
	project string // the URL-encoded full path, GitLab's project ID form
}

// GitLab's member access levels.
const (
	gitLabDeveloper = 30
)

// gitLabDescriptionLimit is what GitLab keeps of a status description.
const gitLabDescriptionLimit = 255

// gitLabState is a status's state in GitLab's words: it has no error or
// failure, only failed; a pending status whose work started is running.
func gitLabState(s Status) string {
	switch s.State {
	case StatePending:
		if s.Running {
			return "running"
		}
		return "pending"
	case StateSuccess:
		return "success"
	}
	return "failed"
}

// PostStatus: POST /api/v4/projects/{id}/statuses/{sha}. GitLab refuses
// with 400 "Cannot transition status" a status that is already in the
// state posted (pending again, running again): the forge shows what we
// meant, so that counts as posted.
func (g *gitLab) PostStatus(ctx context.Context, s Status) error {
	if err := checkStatus(s); err != nil {
		return err
	}
	body := map[string]string{"state": gitLabState(s), "name": s.Context}
	if s.Description != "" {
		body["description"] = truncate(s.Description, gitLabDescriptionLimit)
	}
	if s.TargetURL != "" {
		body["target_url"] = s.TargetURL
	}
	err := g.api.call(ctx, http.MethodPost, "/projects/"+g.project+"/statuses/"+url.PathEscape(s.Commit), body, nil)
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusBadRequest && strings.Contains(ae.Message, "Cannot transition status") {
		return nil
	}
	return err
}

// CanWrite finds the user (GET /api/v4/users?username=) and their
// membership, inherited ones included (GET
// /api/v4/projects/{id}/members/all/{user_id}): Developer (30) or more
// may push.
func (g *gitLab) CanWrite(ctx context.Context, user string) (bool, error) {
	if err := checkUser(user); err != nil {
		return false, err
	}
	var users []struct {
		ID       int64  `json:"id"`
		Username string `json:"username"`
	}
	if err := g.api.call(ctx, http.MethodGet, "/users?username="+url.QueryEscape(user), nil, &users); err != nil {
		return false, err
	}
	var id int64
	for _, u := range users {
		if strings.EqualFold(u.Username, user) {
			id = u.ID
		}
	}
	if id <= 0 {
		return false, nil
	}
	var member struct {
		AccessLevel int `json:"access_level"`
	}
	err := g.api.call(ctx, http.MethodGet, "/projects/"+g.project+"/members/all/"+strconv.FormatInt(id, 10), nil, &member)
	if statusOf(err) == http.StatusNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return member.AccessLevel >= gitLabDeveloper, nil
}

// Check reads the project; posting a status needs Developer access,
// directly or through a group.
func (g *gitLab) Check(ctx context.Context) error {
	var p struct {
		Permissions struct {
			ProjectAccess *struct {
				AccessLevel int `json:"access_level"`
			} `json:"project_access"`
			GroupAccess *struct {
				AccessLevel int `json:"access_level"`
			} `json:"group_access"`
		} `json:"permissions"`
	}
	if err := g.api.call(ctx, http.MethodGet, "/projects/"+g.project, nil, &p); err != nil {
		return explainRead(err)
	}
	level := 0
	if a := p.Permissions.ProjectAccess; a != nil {
		level = a.AccessLevel
	}
	if a := p.Permissions.GroupAccess; a != nil {
		level = max(level, a.AccessLevel)
	}
	if level < gitLabDeveloper {
		return fmt.Errorf("forge: the token can read the project but its access level is %d; posting statuses needs Developer (30) or more and the api scope", level)
	}
	// The token's own scopes (GitLab 15.5 and later; older answer 404,
	// and then the first status shows it).
	var self struct {
		Scopes []string `json:"scopes"`
		Active *bool    `json:"active"`
	}
	err := g.api.call(ctx, http.MethodGet, "/personal_access_tokens/self", nil, &self)
	if err != nil {
		var re *RetryableError
		if statusOf(err) == http.StatusUnauthorized || errors.As(err, &re) {
			return explainRead(err)
		}
		return nil
	}
	for _, s := range self.Scopes {
		if s == "api" {
			return nil
		}
	}
	return fmt.Errorf("forge: the token has scopes %q; posting statuses needs the api scope", strings.Join(self.Scopes, ","))
}
