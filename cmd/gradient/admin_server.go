package main

import (
	"fmt"
	"time"
)

func serverStatus(c *adminCmd) int {
	return serverCall(c, "GET", "/api/v1/server")
}

func serverStopAccepting(c *adminCmd) int {
	return serverCall(c, "POST", "/api/v1/server/stop-accepting")
}

func serverResumeAccepting(c *adminCmd) int {
	return serverCall(c, "POST", "/api/v1/server/resume-accepting")
}

func serverCall(c *adminCmd, method, path string) int {
	var s serverInfo
	raw, ok := c.call(method, path, nil, &s)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	accepting := "yes"
	if !s.Accepting {
		accepting = "no (new worker connections are refused with 403)"
	}
	pairs := []string{"accepting", accepting, "connected workers", fmt.Sprint(s.ConnectedWorkers)}
	if s.InstanceID != "" {
		pairs = append(pairs, "instance", s.InstanceID)
	}
	for _, in := range s.Instances {
		workers := ""
		if in.Workers != nil {
			workers = fmt.Sprintf(", %d workers", *in.Workers)
		}
		pairs = append(pairs, "live instance", fmt.Sprintf("%s on %s (%s)%s, started %s, lease until %s",
			in.ID, in.Host, in.Addr, workers, in.StartedAt.Local().Format(time.DateTime), in.LeaseUntil.Local().Format(time.TimeOnly)))
	}
	for _, w := range s.Warnings {
		pairs = append(pairs, "warning", w)
	}
	fields(c.stdout, pairs...)
	return exitOK
}
