package main

import (
	"fmt"
	"net/url"
	"strings"
)

func projectCreate(c *adminCmd) int {
	pos := c.args
	repository, branch, wildcards := c.cmd.String("repository"), c.cmd.String("branch"), c.cmd.String("wildcards")
	team, name, found := strings.Cut(pos[0], "/")
	if !found || team == "" || name == "" {
		fmt.Fprintf(c.stderr, "gradient %s: %q: want TEAM/NAME\n", c.name, pos[0])
		return exitUsage
	}
	if repository == "" {
		fmt.Fprintf(c.stderr, "gradient %s: --repository is required\n", c.name)
		return exitUsage
	}
	body := map[string]any{"team": team, "name": name, "repository": repository, "branch": branch}
	if wildcards != "" {
		body["wildcards"] = []string{wildcards}
	}
	var p projectInfo
	raw, ok := c.call("POST", "/api/v1/projects", body, &p)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Created project %s (%s), building %s\n", p.FullName(), p.ID, projectWildcards(p))
	fmt.Fprintf(c.stdout, "Next: subscribe it to a cache (gradient project subscribe %s CACHE); workers refuse projects without one.\n", p.FullName())
	return exitOK
}

func projectList(c *adminCmd) int {
	team := c.cmd.String("team")
	path := "/api/v1/projects"
	if team != "" {
		path += "?team=" + url.QueryEscape(team)
	}
	var projects []projectInfo
	raw, ok := c.call("GET", path, nil, &projects)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(projects))
	for _, p := range projects {
		rows = append(rows, []string{p.FullName(), p.Repository, p.Branch, projectWildcards(p), p.ID})
	}
	table(c.stdout, []string{"PROJECT", "REPOSITORY", "BRANCH", "WILDCARDS", "ID"}, rows)
	return exitOK
}

func projectShow(c *adminCmd) int {
	pos := c.args
	var p projectInfo
	raw, ok := c.call("GET", "/api/v1/projects/"+seg(pos[0]), nil, &p)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fields(c.stdout,
		"project", p.FullName(),
		"id", p.ID,
		"repository", p.Repository,
		"branch", p.Branch,
		"wildcards", projectWildcards(p),
		"caches", listOrDash(p.Caches),
		"granted teams", listOrDash(p.GrantedTeams),
		"deploy key", orDash(p.DeployKey),
		"created", when(p.CreatedAt))
	return exitOK
}

// projectUpdate changes what the project's later evaluations build.
func projectUpdate(c *adminCmd) int {
	pos := c.args
	wildcards := c.cmd.String("wildcards")
	if wildcards == "" {
		fmt.Fprintf(c.stderr, "gradient %s: --wildcards is required\n", c.name)
		return exitUsage
	}
	var p projectInfo
	raw, ok := c.call("PATCH", "/api/v1/projects/"+seg(pos[0]), map[string]any{"wildcards": []string{wildcards}}, &p)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Project %s builds %s from its next evaluation on\n", p.FullName(), projectWildcards(p))
	return exitOK
}

// projectDeployKey generates the project's SSH deploy key (replacing an
// earlier one) and prints the public half, or deletes the key.
func projectDeployKey(c *adminCmd) int {
	pos := c.args
	remove := c.cmd.Bool("delete")
	path := "/api/v1/projects/" + seg(pos[0]) + "/deploy-key"
	if remove {
		if _, ok := c.call("DELETE", path, nil, nil); !ok {
			return exitFail
		}
		return c.done("Deleted the deploy key of project " + pos[0])
	}
	var k deployKeyInfo
	raw, ok := c.call("POST", path, nil, &k)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintln(c.stdout, k.PublicKey)
	fmt.Fprintf(c.stderr, "Add this public key to the repository host as a read-only deploy key of %s; workers fetch with it from now on.\n", k.Project)
	return exitOK
}

func projectDelete(c *adminCmd) int {
	pos := c.args
	if _, ok := c.call("DELETE", "/api/v1/projects/"+seg(pos[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done("Deleted project " + pos[0])
}

func projectSubscribe(c *adminCmd) int {
	pos := c.args
	var res linkInfo
	raw, ok := c.call("PUT", "/api/v1/projects/"+seg(pos[0])+"/caches/"+seg(pos[1]), nil, &res)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	if !res.Added {
		fmt.Fprintf(c.stdout, "Project %s already subscribes to cache %s\n", pos[0], pos[1])
		return exitOK
	}
	fmt.Fprintf(c.stdout, "Project %s subscribes to cache %s (%d live session(s) reauthorized)\n",
		pos[0], pos[1], res.ReauthorizedSessions)
	return exitOK
}

func projectUnsubscribe(c *adminCmd) int {
	pos := c.args
	if _, ok := c.call("DELETE", "/api/v1/projects/"+seg(pos[0])+"/caches/"+seg(pos[1]), nil, nil); !ok {
		return exitFail
	}
	return c.done(fmt.Sprintf("Project %s no longer subscribes to cache %s", pos[0], pos[1]))
}
