package main

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// proxyWorker is one of the proxy's workers as its API answers it.
type proxyWorker struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	Tenant        string    `json:"tenant"`
	Capabilities  []string  `json:"capabilities"`
	Token         string    `json:"token"` // only when created
	CreatedAt     time.Time `json:"created_at"`
	Live          bool      `json:"live"`
	ConnectedAt   time.Time `json:"connected_at"`
	Draining      bool      `json:"draining"`
	OfflineReason string    `json:"offline_reason"`
	OfflineSince  time.Time `json:"offline_since"`
}

func proxyWorkerCreate(c *adminCmd) int {
	name := c.cmd.String("name")
	if name == "" {
		fmt.Fprintf(c.stderr, "gradient %s: --name is required\n", c.name)
		return exitUsage
	}
	caps := []string{}
	for _, p := range strings.Split(c.cmd.String("capabilities"), ",") {
		if p = strings.TrimSpace(p); p != "" {
			caps = append(caps, p)
		}
	}
	var w proxyWorker
	raw, ok := c.call("POST", "/api/v1/tenants/"+seg(c.args[0])+"/workers", map[string]any{"name": name, "capabilities": caps}, &w)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Created worker %s of tenant %s.\n\n", w.Name, w.Tenant)
	fields(c.stdout,
		"  worker id", w.ID,
		"  capabilities", listOrDash(w.Capabilities),
		"  token", w.Token)
	fmt.Fprintf(c.stdout, "\nStart gradient-worker with --id %s --server-url ws://PROXY/proto\nand this line in its peers file (--peers-file):\n\n  %s:%s\n\n",
		w.ID, w.ID, w.Token)
	fmt.Fprintln(c.stdout, "The token is shown only now: the proxy keeps only its hash. Store it safely.")
	return exitOK
}

func proxyWorkerList(c *adminCmd) int {
	path := "/api/v1/workers"
	if t := c.cmd.String("tenant"); t != "" {
		path += "?" + url.Values{"tenant": {t}}.Encode()
	}
	var ws []proxyWorker
	raw, ok := c.call("GET", path, nil, &ws)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(ws))
	for _, w := range ws {
		state := "offline"
		switch {
		case w.Live && w.Draining:
			state = "draining"
		case w.Live:
			state = "live"
		}
		offline := "-"
		if !w.Live && w.OfflineReason != "" {
			offline = w.OfflineReason + " (" + when(w.OfflineSince) + ")"
		}
		rows = append(rows, []string{w.ID, w.Name, w.Tenant, listOrDash(w.Capabilities), state, when(w.ConnectedAt), offline})
	}
	table(c.stdout, []string{"ID", "NAME", "TENANT", "CAPABILITIES", "STATE", "CONNECTED", "OFFLINE REASON"}, rows)
	return exitOK
}

func proxyWorkerRevoke(c *adminCmd) int {
	if _, ok := c.call("DELETE", "/api/v1/workers/"+seg(c.args[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done("Revoked worker " + c.args[0] + ": its authorization is deleted and its session closed.")
}

func proxySessions(c *adminCmd) int {
	var s struct {
		Upstream []struct {
			Tenant      string    `json:"tenant"`
			URL         string    `json:"url"`
			WorkerID    string    `json:"worker_id"`
			Live        bool      `json:"live"`
			ConnectedAt time.Time `json:"connected_at"`
		} `json:"upstream"`
		Downstream []struct {
			WorkerID     string    `json:"worker_id"`
			Name         string    `json:"name"`
			Tenant       string    `json:"tenant"`
			ConnectedAt  time.Time `json:"connected_at"`
			Capabilities []string  `json:"capabilities"`
			Draining     bool      `json:"draining"`
		} `json:"downstream"`
	}
	raw, ok := c.call("GET", "/api/v1/sessions", nil, &s)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	up := make([][]string, 0, len(s.Upstream))
	for _, u := range s.Upstream {
		state := "connecting"
		if u.Live {
			state = "live"
		}
		up = append(up, []string{u.Tenant, u.URL, u.WorkerID, state, when(u.ConnectedAt)})
	}
	fmt.Fprintln(c.stdout, "Upstream (to tenants' servers):")
	table(c.stdout, []string{"TENANT", "URL", "WORKER ID", "STATE", "CONNECTED"}, up)
	down := make([][]string, 0, len(s.Downstream))
	for _, d := range s.Downstream {
		down = append(down, []string{d.WorkerID, d.Name, d.Tenant, listOrDash(d.Capabilities), yesNo(d.Draining), when(d.ConnectedAt)})
	}
	fmt.Fprintln(c.stdout, "\nDownstream (the proxy's workers):")
	table(c.stdout, []string{"WORKER ID", "NAME", "TENANT", "CAPABILITIES", "DRAINING", "CONNECTED"}, down)
	return exitOK
}
