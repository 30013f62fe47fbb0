package main

import (
	"fmt"
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
	fields(c.stdout, "accepting", accepting, "connected workers", fmt.Sprint(s.ConnectedWorkers))
	for _, w := range s.Warnings {
		fields(c.stdout, "warning", w)
	}
	return exitOK
}
