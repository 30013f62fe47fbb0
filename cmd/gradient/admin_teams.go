package main

import (
	"fmt"
)

func teamCreate(c *adminCmd) int {
	pos := c.args
	var t teamInfo
	raw, ok := c.call("POST", "/api/v1/teams", map[string]any{"name": pos[0]}, &t)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Created team %s (%s)\n", t.Name, t.ID)
	return exitOK
}

func teamList(c *adminCmd) int {
	var teams []teamInfo
	raw, ok := c.call("GET", "/api/v1/teams", nil, &teams)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(teams))
	for _, t := range teams {
		rows = append(rows, []string{t.Name, t.ID, when(t.CreatedAt)})
	}
	table(c.stdout, []string{"TEAM", "ID", "CREATED"}, rows)
	return exitOK
}

func teamShow(c *adminCmd) int {
	pos := c.args
	var t teamInfo
	raw, ok := c.call("GET", "/api/v1/teams/"+seg(pos[0]), nil, &t)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fields(c.stdout, "team", t.Name, "id", t.ID, "created", when(t.CreatedAt))
	return exitOK
}

func teamDelete(c *adminCmd) int {
	pos := c.args
	if _, ok := c.call("DELETE", "/api/v1/teams/"+seg(pos[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done("Deleted team " + pos[0])
}

func teamWorkerAdd(c *adminCmd) int {
	pos := c.args
	var cred credentialInfo
	raw, ok := c.call("POST", "/api/v1/teams/"+seg(pos[0])+"/workers", registerBody(c.cmd), &cred)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	printCredential(c, cred, "team "+pos[0])
	return exitOK
}

func teamWorkerList(c *adminCmd) int {
	pos := c.args
	var workers []teamWorkerInfo
	raw, ok := c.call("GET", "/api/v1/teams/"+seg(pos[0])+"/workers", nil, &workers)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(workers))
	for _, w := range workers {
		rows = append(rows, []string{w.WorkerID, jobNames(w.WorkerSettings), orDash(w.URL), when(w.CreatedAt)})
	}
	table(c.stdout, []string{"WORKER", "JOBS", "URL", "CREATED"}, rows)
	return exitOK
}

func teamWorkerRemove(c *adminCmd) int {
	pos := c.args
	if _, ok := c.call("DELETE", "/api/v1/teams/"+seg(pos[0])+"/workers/"+seg(pos[1]), nil, nil); !ok {
		return exitFail
	}
	return c.done(fmt.Sprintf("Removed worker %s from team %s", pos[1], pos[0]))
}

func teamGrant(c *adminCmd) int {
	pos := c.args
	var res linkInfo
	raw, ok := c.call("PUT", "/api/v1/projects/"+seg(pos[0])+"/teams/"+seg(pos[1]), nil, &res)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	if !res.Added {
		fmt.Fprintf(c.stdout, "Project %s already grants team %s\n", pos[0], pos[1])
		return exitOK
	}
	fmt.Fprintf(c.stdout, "Project %s now accepts the workers of team %s (%d live session(s) reauthorized)\n",
		pos[0], pos[1], res.ReauthorizedSessions)
	return exitOK
}

func teamRevoke(c *adminCmd) int {
	pos := c.args
	if _, ok := c.call("DELETE", "/api/v1/projects/"+seg(pos[0])+"/teams/"+seg(pos[1]), nil, nil); !ok {
		return exitFail
	}
	return c.done(fmt.Sprintf("Project %s no longer grants team %s", pos[0], pos[1]))
}
