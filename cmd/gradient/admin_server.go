package main

import (
	"fmt"
)

func serverStatus(c *adminCmd, args []string) int {
	return serverCall(c, args, "GET", "/api/v1/server")
}

func serverStopAccepting(c *adminCmd, args []string) int {
	return serverCall(c, args, "POST", "/api/v1/server/stop-accepting")
}

func serverResumeAccepting(c *adminCmd, args []string) int {
	return serverCall(c, args, "POST", "/api/v1/server/resume-accepting")
}

func serverCall(c *adminCmd, args []string, method, path string) int {
	if _, code, ok := c.parse(c.flags(), args); !ok {
		return code
	}
	var s serverInfo
	raw, ok := c.call(method, path, nil, &s)
	if !ok {
		return exitFail
	}
	if c.settings.json {
		return c.printJSON(raw)
	}
	accepting := "yes"
	if !s.Accepting {
		accepting = "no (new worker connections are refused with 403)"
	}
	fields(c.stdout, "accepting", accepting, "connected workers", fmt.Sprint(s.ConnectedWorkers))
	return exitOK
}
