package main

import (
	"fmt"
	"net/url"

	"github.com/urfave/cli/v3"
)

// registerFlags are what worker register and team worker add share.
func registerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "worker-id", Usage: "the worker's `UUID`", DefaultText: "a new one"},
		&cli.StringFlag{Name: "url", Usage: "ws:// or wss:// `URL` where the server dials the worker", DefaultText: "the worker dials"},
		&cli.BoolFlag{Name: "no-fetch", Usage: "do not let the worker fetch"},
		&cli.BoolFlag{Name: "no-eval", Usage: "do not let the worker evaluate"},
		&cli.BoolFlag{Name: "no-build", Usage: "do not let the worker build"},
	}
}

// registerBody is the registration request registerFlags describe.
func registerBody(cmd *cli.Command) map[string]any {
	b := map[string]any{"fetch": !cmd.Bool("no-fetch"), "eval": !cmd.Bool("no-eval"), "build": !cmd.Bool("no-build")}
	if id := cmd.String("worker-id"); id != "" {
		b["worker_id"] = id
	}
	if u := cmd.String("url"); u != "" {
		b["url"] = u
	}
	return b
}

// peerFlags choose the registering peer: exactly one of them.
func peerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "project", Usage: "registering `PROJECT`, TEAM/PROJECT or UUID"},
		&cli.StringFlag{Name: "cache", Usage: "registering `CACHE`, name or UUID"},
		&cli.StringFlag{Name: "proxy", Usage: "registering proxy, `UUID`"},
	}
}

// peer returns the chosen kind and reference, or false after printing a
// usage error.
func (c *adminCmd) peer() (kind, ref string, ok bool) {
	n := 0
	for _, k := range []string{"project", "cache", "proxy"} {
		if r := c.cmd.String(k); r != "" {
			kind, ref = k, r
			n++
		}
	}
	if n != 1 {
		fmt.Fprintf(c.stderr, "gradient %s: give exactly one of --project, --cache or --proxy\n", c.name)
		return "", "", false
	}
	return kind, ref, true
}

func workerRegister(c *adminCmd) int {
	kind, ref, ok := c.peer()
	if !ok {
		return exitUsage
	}
	body := registerBody(c.cmd)
	body["peer_kind"], body["peer"] = kind, ref
	var cred credentialInfo
	raw, ok := c.call("POST", "/api/v1/registrations", body, &cred)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	printCredential(c, cred, kind+" "+ref)
	return exitOK
}

// printCredential shows a new token, which the server will never show again.
func printCredential(c *adminCmd, cred credentialInfo, peer string) {
	w := c.stdout
	fmt.Fprintf(w, "Registered worker %s for %s.\n\n", cred.WorkerID, peer)
	fields(w,
		"  worker id", cred.WorkerID,
		"  peer id", cred.PeerID,
		"  jobs", jobNames(cred.WorkerSettings),
		"  token", cred.Token)
	fmt.Fprintf(w, "\nAdd this line to the worker's peers file (services.gradient.worker.peersFile):\n\n  %s\n\n", cred.PeersLine)
	if cred.AcceptedServerTokenLine != "" {
		// The server dials this worker and presents the token; the worker
		// checks it against this hash.
		fmt.Fprintf(w, "The server dials this worker at %s. Add this line to the worker's\naccepted server tokens file:\n\n  %s\n\n", cred.URL, cred.AcceptedServerTokenLine)
	}
	fmt.Fprintln(w, "The token is shown only now: the server keeps only its hash. Store it safely.")
	if cred.Reauthorized {
		fmt.Fprintln(w, "The worker is connected and was asked to authenticate again.")
	}
}

func workerRegistrations(c *adminCmd) int {
	kind, ref, ok := c.peer()
	if !ok {
		return exitUsage
	}
	var regs []registrationInfo
	q := url.Values{"peer_kind": {kind}, "peer": {ref}}
	raw, ok := c.call("GET", "/api/v1/registrations?"+q.Encode(), nil, &regs)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(regs))
	for _, r := range regs {
		rows = append(rows, []string{r.WorkerID, jobNames(r.WorkerSettings), orDash(r.URL), when(r.CreatedAt)})
	}
	table(c.stdout, []string{"WORKER", "JOBS", "URL", "REGISTERED"}, rows)
	return exitOK
}

func workerUnregister(c *adminCmd) int {
	pos := c.args
	kind, ref, ok := c.peer()
	if !ok {
		return exitUsage
	}
	if _, ok := c.call("DELETE", "/api/v1/registrations/"+kind+"/"+seg(ref)+"/"+seg(pos[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done(fmt.Sprintf("Removed the registration of worker %s by %s %s", pos[0], kind, ref))
}

func workerList(c *adminCmd) int {
	project := c.cmd.String("project")
	if project == "" {
		fmt.Fprintf(c.stderr, "gradient %s: --project is required\n", c.name)
		return exitUsage
	}
	var workers []projectWorkerInfo
	raw, ok := c.call("GET", "/api/v1/projects/"+seg(project)+"/workers", nil, &workers)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	names := c.projectNames()
	rows := make([][]string, 0, len(workers))
	for _, w := range workers {
		live := yesNo(w.Live)
		if w.Live && w.Instance != "" {
			live += " on " + w.Instance // several server instances share the database
		}
		if w.Deactivated {
			live += " (deactivated)"
		}
		projects := make([]string, 0, len(w.Projects))
		for _, id := range w.Projects {
			projects = append(projects, nameOr(names, id))
		}
		rows = append(rows, []string{w.WorkerID, live, listOrDash(projects), listOrDash(w.Capabilities),
			hostArchitectures(w.Host), hostSlots(w.Host), orDash(w.OfflineReason)})
	}
	table(c.stdout, []string{"WORKER", "LIVE", "PROJECTS", "CAPABILITIES", "ARCHITECTURES", "SLOTS", "OFFLINE REASON"}, rows)
	return exitOK
}

// projectNames maps project IDs to TEAM/PROJECT for display; on failure
// the IDs are shown instead.
func (c *adminCmd) projectNames() map[string]string {
	var projects []projectInfo
	if _, err := c.api.call(c.ctx, "GET", "/api/v1/projects", nil, &projects); err != nil {
		return nil
	}
	names := make(map[string]string, len(projects))
	for _, p := range projects {
		names[p.ID] = p.FullName()
	}
	return names
}

func nameOr(names map[string]string, id string) string {
	if n, ok := names[id]; ok {
		return n
	}
	return id
}

func workerShow(c *adminCmd) int {
	pos := c.args
	var w workerInfo
	raw, ok := c.call("GET", "/api/v1/workers/"+seg(pos[0]), nil, &w)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	names := c.projectNames()
	projects := make([]string, 0, len(w.Projects))
	for _, id := range w.Projects {
		projects = append(projects, nameOr(names, id))
	}
	pairs := []string{
		"worker", w.WorkerID,
		"live", yesNo(w.Live),
		"deactivated", yesNo(w.Deactivated),
	}
	if w.Live {
		pairs = append(pairs, "connected", when(w.ConnectedAt), "projects", listOrDash(projects),
			"capabilities", listOrDash(w.Capabilities), "draining", yesNo(w.Draining))
		if w.Instance != "" {
			pairs = append(pairs, "instance", w.Instance)
		}
		pairs = append(pairs, hostPairs(w.Host)...)
	}
	if w.OfflineReason != "" {
		pairs = append(pairs, "offline reason", w.OfflineReason, "offline since", when(w.OfflineSince))
	}
	if w.TeamWorker != nil {
		pairs = append(pairs, "team worker of", w.TeamWorker.TeamID, "jobs", jobNames(w.TeamWorker.WorkerSettings))
	}
	fields(c.stdout, pairs...)
	if len(w.Registrations) > 0 {
		fmt.Fprintln(c.stdout)
		rows := make([][]string, 0, len(w.Registrations))
		for _, r := range w.Registrations {
			peer := r.PeerID
			if r.PeerKind == "project" {
				peer = nameOr(names, r.PeerID)
			}
			rows = append(rows, []string{r.PeerKind, peer, jobNames(r.WorkerSettings), orDash(r.URL)})
		}
		table(c.stdout, []string{"REGISTERED BY", "PEER", "JOBS", "URL"}, rows)
	}
	return exitOK
}

func workerDeactivate(c *adminCmd) int { return setActivation(c, "deactivate") }
func workerActivate(c *adminCmd) int   { return setActivation(c, "activate") }

func setActivation(c *adminCmd, action string) int {
	pos := c.args
	var res activationInfo
	raw, ok := c.call("POST", "/api/v1/workers/"+seg(pos[0])+"/"+action, nil, &res)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	if !res.Deactivated {
		fmt.Fprintf(c.stdout, "Worker %s is active: it may connect.\n", res.WorkerID)
		return exitOK
	}
	fmt.Fprintf(c.stdout, "Worker %s is deactivated: its connects are refused with 403.\n", res.WorkerID)
	if res.Live {
		fmt.Fprintln(c.stdout, "Its current session stays up until it disconnects.")
	}
	return exitOK
}
