package main

import (
	"fmt"
)

func teamCreate(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "NAME")
	if !ok {
		return code
	}
	var t teamInfo
	raw, ok := c.call("POST", "/api/v1/teams", map[string]any{"name": pos[0]}, &t)
	if !ok {
		return exitFail
	}
	if c.settings.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Created team %s (%s)\n", t.Name, t.ID)
	return exitOK
}

func teamList(c *adminCmd, args []string) int {
	if _, code, ok := c.parse(c.flags(), args); !ok {
		return code
	}
	var teams []teamInfo
	raw, ok := c.call("GET", "/api/v1/teams", nil, &teams)
	if !ok {
		return exitFail
	}
	if c.settings.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(teams))
	for _, t := range teams {
		rows = append(rows, []string{t.Name, t.ID, when(t.CreatedAt)})
	}
	table(c.stdout, []string{"TEAM", "ID", "CREATED"}, rows)
	return exitOK
}

func teamShow(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "TEAM")
	if !ok {
		return code
	}
	var t teamInfo
	raw, ok := c.call("GET", "/api/v1/teams/"+seg(pos[0]), nil, &t)
	if !ok {
		return exitFail
	}
	if c.settings.json {
		return c.printJSON(raw)
	}
	fields(c.stdout, "team", t.Name, "id", t.ID, "created", when(t.CreatedAt))
	return exitOK
}

func teamDelete(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "TEAM")
	if !ok {
		return code
	}
	if _, ok := c.call("DELETE", "/api/v1/teams/"+seg(pos[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done("Deleted team " + pos[0])
}

func teamWorkerAdd(c *adminCmd, args []string) int {
	fs := c.flags()
	in := registerFlags(fs)
	pos, code, ok := c.parse(fs, args, "TEAM")
	if !ok {
		return code
	}
	var cred credentialInfo
	raw, ok := c.call("POST", "/api/v1/teams/"+seg(pos[0])+"/workers", in.body(), &cred)
	if !ok {
		return exitFail
	}
	if c.settings.json {
		return c.printJSON(raw)
	}
	printCredential(c, cred, "team "+pos[0])
	return exitOK
}

func teamWorkerList(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "TEAM")
	if !ok {
		return code
	}
	var workers []teamWorkerInfo
	raw, ok := c.call("GET", "/api/v1/teams/"+seg(pos[0])+"/workers", nil, &workers)
	if !ok {
		return exitFail
	}
	if c.settings.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(workers))
	for _, w := range workers {
		rows = append(rows, []string{w.WorkerID, w.jobKinds.String(), orDash(w.URL), when(w.CreatedAt)})
	}
	table(c.stdout, []string{"WORKER", "JOBS", "URL", "CREATED"}, rows)
	return exitOK
}

func teamWorkerRemove(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "TEAM", "WORKER_ID")
	if !ok {
		return code
	}
	if _, ok := c.call("DELETE", "/api/v1/teams/"+seg(pos[0])+"/workers/"+seg(pos[1]), nil, nil); !ok {
		return exitFail
	}
	return c.done(fmt.Sprintf("Removed worker %s from team %s", pos[1], pos[0]))
}

func teamGrant(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "TEAM/PROJECT", "TEAM")
	if !ok {
		return code
	}
	var res linkInfo
	raw, ok := c.call("PUT", "/api/v1/projects/"+seg(pos[0])+"/teams/"+seg(pos[1]), nil, &res)
	if !ok {
		return exitFail
	}
	if c.settings.json {
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

func teamRevoke(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "TEAM/PROJECT", "TEAM")
	if !ok {
		return code
	}
	if _, ok := c.call("DELETE", "/api/v1/projects/"+seg(pos[0])+"/teams/"+seg(pos[1]), nil, nil); !ok {
		return exitFail
	}
	return c.done(fmt.Sprintf("Project %s no longer grants team %s", pos[0], pos[1]))
}
