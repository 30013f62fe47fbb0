package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// proxyTenant is a tenant as the proxy's API answers it.
type proxyTenant struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	MayRun    bool       `json:"may_run"`
	CreatedAt time.Time  `json:"created_at"`
	Link      *proxyLink `json:"link"`
	Workers   int        `json:"workers"`
}

// proxyLink is a tenant's upstream link: the peers' IDs, never tokens.
type proxyLink struct {
	Tenant       string    `json:"tenant"`
	TenantMayRun bool      `json:"tenant_may_run"`
	URL          string    `json:"url"`
	WorkerID     string    `json:"worker_id"`
	Peers        []string  `json:"peers"`
	Enabled      bool      `json:"enabled"`
	State        string    `json:"state"`
	Reason       string    `json:"reason"`
	Since        time.Time `json:"since"`
	Connects     bool      `json:"connects"`
	Session      struct {
		Active      bool      `json:"active"`
		Live        bool      `json:"live"`
		ConnectedAt time.Time `json:"connected_at"`
	} `json:"session"`
}

func proxyTenantCreate(c *adminCmd) int {
	var t proxyTenant
	raw, ok := c.call("POST", "/api/v1/tenants", map[string]string{"name": c.args[0]}, &t)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Created tenant %s (%s). Next: gradient proxy link set %s --url … --worker-id … --peers-file …\n", t.Name, t.ID, t.Name)
	return exitOK
}

func proxyTenantList(c *adminCmd) int {
	var ts []proxyTenant
	raw, ok := c.call("GET", "/api/v1/tenants", nil, &ts)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(ts))
	for _, t := range ts {
		rows = append(rows, []string{t.Name, t.ID, yesNo(t.MayRun), when(t.CreatedAt)})
	}
	table(c.stdout, []string{"NAME", "ID", "MAY RUN", "CREATED"}, rows)
	return exitOK
}

func proxyTenantShow(c *adminCmd) int {
	var t proxyTenant
	raw, ok := c.call("GET", "/api/v1/tenants/"+seg(c.args[0]), nil, &t)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fields(c.stdout, "name", t.Name, "id", t.ID, "may run", yesNo(t.MayRun), "created", when(t.CreatedAt),
		"workers", strconv.Itoa(t.Workers))
	if t.Link == nil {
		fmt.Fprintf(c.stdout, "link:     none (gradient proxy link set %s …)\n", t.Name)
		return exitOK
	}
	fmt.Fprintln(c.stdout, "link:")
	printLink(c.stdout, *t.Link, "  ")
	return exitOK
}

func printLink(w io.Writer, l proxyLink, indent string) {
	session := "none"
	switch {
	case l.Session.Live:
		session = "live since " + when(l.Session.ConnectedAt)
	case l.Session.Active:
		session = "connecting"
	case !l.Connects:
		session = "none: the link does not connect (" + whyNot(l) + ")"
	}
	fields(w,
		indent+"url", l.URL,
		indent+"worker id", l.WorkerID,
		indent+"peers", listOrDash(l.Peers),
		indent+"enabled", yesNo(l.Enabled),
		indent+"state", l.State,
		indent+"reason", orDash(l.Reason),
		indent+"since", when(l.Since),
		indent+"session", session)
}

// whyNot says why a link does not connect.
func whyNot(l proxyLink) string {
	switch {
	case l.State == "failing":
		return "failing: set it again"
	case !l.Enabled:
		return "disabled"
	case !l.TenantMayRun:
		return "the tenant may not run"
	}
	return "-"
}

func proxyTenantDelete(c *adminCmd) int {
	if _, ok := c.call("DELETE", "/api/v1/tenants/"+seg(c.args[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done("Deleted tenant " + c.args[0] + " with its link: its workers were revoked (their sessions closed) and its upstream session stops.")
}

func proxyTenantMayRun(c *adminCmd) int {
	var on bool
	switch c.args[1] {
	case "on":
		on = true
	case "off":
	default:
		fmt.Fprintf(c.stderr, "gradient %s: want on or off, not %q\n", c.name, c.args[1])
		return exitUsage
	}
	var t proxyTenant
	raw, ok := c.call("PUT", "/api/v1/tenants/"+seg(c.args[0])+"/may-run", map[string]bool{"may_run": on}, &t)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	if t.MayRun {
		fmt.Fprintf(c.stdout, "Tenant %s may run: its link connects when enabled.\n", t.Name)
	} else {
		fmt.Fprintf(c.stdout, "Tenant %s may not run: its upstream session stops.\n", t.Name)
	}
	return exitOK
}

// maxPeersFile bounds the peers file link set reads (the proxy refuses
// more than 1 MiB too).
const maxPeersFile = 1 << 20

func proxyLinkSet(c *adminCmd) int {
	url, workerID, file := c.cmd.String("url"), c.cmd.String("worker-id"), c.cmd.String("peers-file")
	var missing []string
	for _, f := range []struct{ name, value string }{{"--url", url}, {"--worker-id", workerID}, {"--peers-file", file}} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(c.stderr, "gradient %s: %v required\n", c.name, missing)
		return exitUsage
	}
	f, err := os.Open(file)
	if err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: --peers-file: %v\n", c.name, err)
		return exitUsage
	}
	peers, err := io.ReadAll(io.LimitReader(f, maxPeersFile+1))
	f.Close()
	if err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: --peers-file: %v\n", c.name, err)
		return exitFail
	}
	if len(peers) > maxPeersFile {
		fmt.Fprintf(c.stderr, "gradient %s: --peers-file %s is larger than %d bytes\n", c.name, file, maxPeersFile)
		return exitUsage
	}
	var l proxyLink
	raw, ok := c.call("PUT", "/api/v1/tenants/"+seg(c.args[0])+"/link",
		map[string]string{"url": url, "worker_id": workerID, "peers": string(peers)}, &l)
	if !ok {
		return exitFail
	}
	return c.linkAnswer(raw, l, "Link of "+l.Tenant+" set.")
}

func proxyLinkEnable(c *adminCmd) int  { return c.linkSwitch("enable") }
func proxyLinkDisable(c *adminCmd) int { return c.linkSwitch("disable") }

func (c *adminCmd) linkSwitch(verb string) int {
	var l proxyLink
	raw, ok := c.call("POST", "/api/v1/tenants/"+seg(c.args[0])+"/link/"+verb, nil, &l)
	if !ok {
		return exitFail
	}
	return c.linkAnswer(raw, l, "Link of "+l.Tenant+" "+verb+"d.")
}

func proxyLinkStatus(c *adminCmd) int {
	var l proxyLink
	raw, ok := c.call("GET", "/api/v1/tenants/"+seg(c.args[0])+"/link", nil, &l)
	if !ok {
		return exitFail
	}
	return c.linkAnswer(raw, l, "")
}

func (c *adminCmd) linkAnswer(raw []byte, l proxyLink, sentence string) int {
	if c.json {
		return c.printJSON(raw)
	}
	if sentence != "" {
		fmt.Fprintf(c.stdout, "%s\n\n", sentence)
	}
	printLink(c.stdout, l, "")
	return exitOK
}
