package admin

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/nix/wildcard"
	"gradient.dev/gradient/storage"
)

func (a *API) createProject(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Team       string `json:"team"`
		Name       string `json:"name"`
		Repository string `json:"repository"`
		Branch     string `json:"branch"`
		// Wildcards: none is the default (storage.DefaultWildcards).
		Wildcards []string `json:"wildcards"`
	}
	if err := decodeBody(w, r, &in); err != nil {
		return err
	}
	var wildcards []string
	if in.Wildcards != nil {
		var err error
		if wildcards, err = ParseWildcards(in.Wildcards); err != nil {
			return err
		}
	}
	if in.Team == "" {
		return invalidf("team is empty: name the team that owns the project")
	}
	if in.Branch == "" {
		in.Branch = "main"
	}
	t, err := a.team(r.Context(), in.Team)
	if err != nil {
		return err
	}
	if err := a.checkSource(in.Repository, in.Branch); err != nil {
		return err
	}
	p, err := a.db.CreateProject(r.Context(), storage.NewProject{
		TeamID: t.ID, Name: in.Name, Repository: in.Repository, Branch: in.Branch, Wildcards: wildcards,
	})
	if err != nil {
		return err
	}
	a.log.Info("admin: project created", "project", t.Name+"/"+p.Name, "project_id", p.ID, "wildcards", p.Wildcards)
	writeJSON(w, http.StatusCreated, viewProject(p, t.Name))
	return nil
}

// Bounds on a project's wildcards: a few patterns are the norm, and each
// one goes to every evaluation of the project.
const (
	MaxWildcards      = 64
	MaxWildcardLength = 256
)

// ParseWildcards checks wildcards given by an operator (docs/protocol/worker.md §6.2;
// each element may hold several, comma-separated) and returns one trimmed
// pattern or exclusion per element. Its errors are ErrInvalid and say
// what is wrong.
func ParseWildcards(in []string) ([]string, error) {
	list, err := wildcard.Split(in)
	if err != nil {
		return nil, invalidf("wildcards: %s", strings.TrimPrefix(err.Error(), "wildcard: "))
	}
	if len(list) > MaxWildcards {
		return nil, invalidf("wildcards: %d patterns, at most %d allowed", len(list), MaxWildcards)
	}
	for _, w := range list {
		if len(w) > MaxWildcardLength {
			return nil, invalidf("wildcards: pattern %.40q… is longer than %d bytes", w, MaxWildcardLength)
		}
	}
	return list, nil
}

// updateProject changes what a project's evaluations build from now on;
// evaluations already queued keep the wildcards they were queued with.
func (a *API) updateProject(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var in struct {
		Wildcards []string `json:"wildcards"`
	}
	if err := decodeBody(w, r, &in); err != nil {
		return err
	}
	if in.Wildcards == nil {
		return invalidf("nothing to update: give wildcards")
	}
	wildcards, err := ParseWildcards(in.Wildcards)
	if err != nil {
		return err
	}
	p, err := a.project(ctx, r.PathValue("project"))
	if err == nil {
		err = a.db.UpdateProjectWildcards(ctx, p.ID, wildcards)
	}
	if err == nil {
		p, err = a.db.Project(ctx, p.ID)
	}
	var t storage.Team
	if err == nil {
		t, err = a.db.Team(ctx, p.TeamID)
	}
	if err != nil {
		return err
	}
	a.log.Info("admin: project updated", "project", t.Name+"/"+p.Name, "project_id", p.ID, "wildcards", p.Wildcards)
	writeJSON(w, http.StatusOK, viewProject(p, t.Name))
	return nil
}

// checkSource refuses a repository or branch that git must not be given
// (an option, a remote helper, a local repository the operator did not
// allow, a branch git check-ref-format refuses) when a project's source
// is set, rather than at every poll.
func (a *API) checkSource(repository, branch string) error {
	if err := gitsource.ValidateRepositoryURL(repository, a.cfg.AllowLocalRepositories); err != nil {
		return invalidf("repository: %v", err)
	}
	if err := gitsource.ValidateBranch(branch); err != nil {
		return invalidf("branch: %v", err)
	}
	return nil
}

func (a *API) listProjects(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	names, err := a.teamNames(ctx)
	if err != nil {
		return err
	}
	var projects []storage.Project
	if ref := r.URL.Query().Get("team"); ref != "" {
		// No := here: a shadowed err would drop the listing's error and
		// answer 200 with an empty list.
		var t storage.Team
		if t, err = a.team(ctx, ref); err != nil {
			return err
		}
		projects, err = a.db.ListTeamProjects(ctx, t.ID)
	} else {
		projects, err = a.db.ListProjects(ctx)
	}
	if err != nil {
		return err
	}
	views := make([]ProjectView, 0, len(projects))
	for _, p := range projects {
		views = append(views, viewProject(p, names[p.TeamID]))
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}

func (a *API) showProject(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	names, err := a.teamNames(ctx)
	if err != nil {
		return err
	}
	caches, err := a.db.ProjectCaches(ctx, p.ID)
	if err != nil {
		return err
	}
	granted, err := a.db.ProjectGrantedTeams(ctx, p.ID)
	if err != nil {
		return err
	}
	v := viewProject(p, names[p.TeamID])
	for _, c := range caches {
		v.Caches = append(v.Caches, c.Name)
	}
	for _, t := range granted {
		v.GrantedTeams = append(v.GrantedTeams, t.Name)
	}
	switch key, err := a.db.DeployKey(ctx, p.ID); {
	case err == nil:
		v.DeployKey = key.PublicKey
	case !errors.Is(err, storage.ErrNotFound):
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (a *API) generateDeployKey(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	name := a.projectName(ctx, p)
	public, err := a.cfg.DeployKeys.Generate(ctx, p, "gradient-"+strings.ReplaceAll(name, "/", "-"))
	if err != nil {
		return err
	}
	a.log.Info("admin: deploy key generated", "project", name, "project_id", p.ID)
	writeJSON(w, http.StatusOK, DeployKeyView{Project: name, PublicKey: public})
	return nil
}

func (a *API) deleteDeployKey(w http.ResponseWriter, r *http.Request) error {
	p, err := a.project(r.Context(), r.PathValue("project"))
	if err == nil {
		err = a.db.DeleteDeployKey(r.Context(), p.ID)
	}
	if err != nil {
		return err
	}
	a.log.Info("admin: deploy key deleted", "project_id", p.ID, "name", p.Name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) deleteProject(w http.ResponseWriter, r *http.Request) error {
	p, err := a.project(r.Context(), r.PathValue("project"))
	if err == nil {
		err = a.db.DeleteProject(r.Context(), p.ID)
	}
	if err != nil {
		return err
	}
	a.cfg.Cache.SubscriptionsChanged(p.ID)
	a.log.Info("admin: project deleted", "project_id", p.ID, "name", p.Name)
	a.cfg.Dialer.RefreshDials() // its registrations went with it
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) subscribe(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err != nil {
		return err
	}
	added, err := a.db.SubscribeProject(ctx, p.ID, c.ID)
	if err != nil {
		return err
	}
	res := LinkResult{Added: added}
	if added {
		a.cfg.Cache.SubscriptionsChanged(p.ID)
		a.log.Info("admin: project subscribed", "project_id", p.ID, "cache", c.Name)
		// docs/protocol/connection.md: a project subscribing to a cache reauths the
		// project's workers, whose project failed for lack of a cache.
		res.ReauthorizedSessions = a.reauth(ctx, "project", p.ID, a.cfg.Workers.ReauthProject)
	}
	writeJSON(w, linkStatus(added), res)
	return nil
}

func (a *API) unsubscribe(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	c, err := a.cache(ctx, r.PathValue("cache"))
	if err == nil {
		err = a.db.UnsubscribeProject(ctx, p.ID, c.ID)
	}
	if err != nil {
		return err
	}
	a.cfg.Cache.SubscriptionsChanged(p.ID)
	a.log.Info("admin: project unsubscribed", "project_id", p.ID, "cache", c.Name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) grant(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	t, err := a.team(ctx, r.PathValue("team"))
	if err != nil {
		return err
	}
	added, err := a.db.GrantTeam(ctx, p.ID, t.ID)
	if err != nil {
		return err
	}
	res := LinkResult{Added: added}
	if added {
		a.log.Info("admin: team granted", "project_id", p.ID, "team", t.Name)
		// Live team workers join the project without reconnecting.
		res.ReauthorizedSessions = a.reauth(ctx, "team", t.ID, a.cfg.Workers.ReauthTeam)
	}
	writeJSON(w, linkStatus(added), res)
	return nil
}

func (a *API) revoke(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	t, err := a.team(ctx, r.PathValue("team"))
	if err == nil {
		err = a.db.RevokeTeam(ctx, p.ID, t.ID)
	}
	if err != nil {
		return err
	}
	a.log.Info("admin: team grant revoked", "project_id", p.ID, "team", t.Name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) projectWorkers(w http.ResponseWriter, r *http.Request) error {
	p, err := a.project(r.Context(), r.PathValue("project"))
	if err != nil {
		return err
	}
	workers, err := a.cfg.Workers.ProjectWorkers(r.Context(), p.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, listOf(workers))
	return nil
}

// reauth runs a reauth after a change that is already committed: a
// failure is logged, not returned, because the change itself stands and
// the workers pick it up on their next connect.
func (a *API) reauth(ctx context.Context, what, id string, fn func(context.Context, string) (int, error)) int {
	n, err := fn(ctx, id)
	if err != nil {
		a.log.Warn("admin: reauth after change failed", what, id, "error", err)
	}
	return n
}

// linkStatus is 201 for a new subscription or grant, 200 for one that
// already existed (PUT is idempotent).
func linkStatus(added bool) int {
	if added {
		return http.StatusCreated
	}
	return http.StatusOK
}

// teamNames maps team IDs to names, for showing projects as TEAM/PROJECT.
func (a *API) teamNames(ctx context.Context) (map[string]string, error) {
	teams, err := a.db.ListTeams(ctx)
	if err != nil {
		return nil, err
	}
	names := make(map[string]string, len(teams))
	for _, t := range teams {
		names[t.ID] = t.Name
	}
	return names, nil
}
