package main

import (
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
)

// The `gradient proxy hetzner …` and `gradient proxy usage` commands:
// a tenant's Hetzner Cloud workers and their metered usage.

type proxyHetznerSystem struct {
	ServerType string `json:"server_type"`
	Location   string `json:"location,omitempty"`
	Slots      int    `json:"slots"`
}

type proxyHetzner struct {
	Tenant        string                        `json:"tenant"`
	Enabled       bool                          `json:"enabled"`
	MaxVMs        int                           `json:"max_vms"`
	Systems       map[string]proxyHetznerSystem `json:"systems"`
	SnapshotID    int64                         `json:"snapshot_id"`
	SnapshotLabel string                        `json:"snapshot_label"`
	SSHKeys       []int64                       `json:"ssh_keys"`
	Labels        map[string]string             `json:"labels"`
	Capabilities  []string                      `json:"capabilities"`
	UpdatedAt     time.Time                     `json:"updated_at"`
	BootBackoff   []struct {
		System       string    `json:"system"`
		Failures     int       `json:"failed_boots"`
		LastFailedAt time.Time `json:"last_failed_at"`
		RetryAt      time.Time `json:"retry_at"`
	} `json:"boot_backoff"`
}

func proxyHetznerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "enabled", Usage: "boot VMs for the tenant (--enabled=false drains and deletes them)", Value: true},
		&cli.IntFlag{Name: "max-vms", Usage: "the tenant's most VMs over all systems (`N`)", Required: true},
		&cli.StringSliceFlag{Name: "system", Usage: "`SYSTEM=TYPE[@LOCATION][:SLOTS]`, e.g. x86_64-linux=cx22@fsn1:2 (repeat per system; slots default 1)"},
		&cli.Int64Flag{Name: "snapshot-id", Usage: "the worker snapshot's image `ID`"},
		&cli.StringFlag{Name: "snapshot-label", Usage: "boot the newest available snapshot matching this label `SELECTOR` (gradient-worker, gradient-worker=v3)"},
		&cli.StringSliceFlag{Name: "ssh-key", Usage: "Hetzner SSH key `ID` to add (repeatable)"},
		&cli.StringSliceFlag{Name: "label", Usage: "`KEY=VALUE` label to add to every server (repeatable)"},
		&cli.StringFlag{Name: "capabilities", Usage: "comma-separated `LIST` of what the VMs' workers may do: fetch, eval, build", Value: "fetch,eval,build"},
	}
}

// parseSystem reads SYSTEM=TYPE[@LOCATION][:SLOTS].
func parseSystem(s string) (string, proxyHetznerSystem, error) {
	system, rest, ok := strings.Cut(s, "=")
	if !ok || system == "" || rest == "" {
		return "", proxyHetznerSystem{}, fmt.Errorf("--system %q: want SYSTEM=TYPE[@LOCATION][:SLOTS]", s)
	}
	out := proxyHetznerSystem{Slots: 1}
	if i := strings.LastIndex(rest, ":"); i >= 0 {
		n, err := strconv.Atoi(rest[i+1:])
		if err != nil || n < 1 {
			return "", out, fmt.Errorf("--system %q: slots %q is not a positive number", s, rest[i+1:])
		}
		out.Slots, rest = n, rest[:i]
	}
	out.ServerType, out.Location, _ = strings.Cut(rest, "@")
	return strings.TrimSpace(system), out, nil
}

func proxyHetznerSet(c *adminCmd) int {
	body := map[string]any{"enabled": c.cmd.Bool("enabled"), "max_vms": c.cmd.Int("max-vms"),
		"snapshot_id": c.cmd.Int64("snapshot-id"), "snapshot_label": c.cmd.String("snapshot-label")}
	systems := map[string]proxyHetznerSystem{}
	for _, s := range c.cmd.StringSlice("system") {
		name, sys, err := parseSystem(s)
		if err != nil {
			fmt.Fprintf(c.stderr, "gradient %s: %v\n", c.name, err)
			return exitUsage
		}
		if _, dup := systems[name]; dup {
			fmt.Fprintf(c.stderr, "gradient %s: --system %s is given twice\n", c.name, name)
			return exitUsage
		}
		systems[name] = sys
	}
	body["systems"] = systems
	keys := []int64{}
	for _, k := range c.cmd.StringSlice("ssh-key") {
		id, err := strconv.ParseInt(strings.TrimSpace(k), 10, 64)
		if err != nil {
			fmt.Fprintf(c.stderr, "gradient %s: --ssh-key %q: want the key's numeric Hetzner ID\n", c.name, k)
			return exitUsage
		}
		keys = append(keys, id)
	}
	body["ssh_keys"] = keys
	labels := map[string]string{}
	for _, l := range c.cmd.StringSlice("label") {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			fmt.Fprintf(c.stderr, "gradient %s: --label %q: want KEY=VALUE\n", c.name, l)
			return exitUsage
		}
		labels[k] = v
	}
	body["labels"] = labels
	caps := []string{}
	for _, p := range strings.Split(c.cmd.String("capabilities"), ",") {
		if p = strings.TrimSpace(p); p != "" {
			caps = append(caps, p)
		}
	}
	body["capabilities"] = caps
	var h proxyHetzner
	raw, ok := c.call("PUT", "/api/v1/tenants/"+seg(c.args[0])+"/hetzner", body, &h)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Hetzner workers of %s set.\n\n", h.Tenant)
	printHetzner(c, h)
	return exitOK
}

func proxyHetznerShow(c *adminCmd) int {
	var h proxyHetzner
	raw, ok := c.call("GET", "/api/v1/tenants/"+seg(c.args[0])+"/hetzner", nil, &h)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	printHetzner(c, h)
	return exitOK
}

func printHetzner(c *adminCmd, h proxyHetzner) {
	snapshot := "label " + h.SnapshotLabel + " (newest available)"
	if h.SnapshotID != 0 {
		snapshot = "image " + strconv.FormatInt(h.SnapshotID, 10)
	}
	keys := make([]string, 0, len(h.SSHKeys))
	for _, k := range h.SSHKeys {
		keys = append(keys, strconv.FormatInt(k, 10))
	}
	labels := make([]string, 0, len(h.Labels))
	for k, v := range h.Labels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	fields(c.stdout,
		"  enabled", yesNo(h.Enabled),
		"  max VMs", strconv.Itoa(h.MaxVMs),
		"  snapshot", snapshot,
		"  SSH keys", listOrDash(keys),
		"  labels", listOrDash(labels),
		"  capabilities", listOrDash(h.Capabilities),
		"  updated", when(h.UpdatedAt))
	names := make([]string, 0, len(h.Systems))
	for s := range h.Systems {
		names = append(names, s)
	}
	sort.Strings(names)
	rows := make([][]string, 0, len(names))
	for _, s := range names {
		sys := h.Systems[s]
		rows = append(rows, []string{s, sys.ServerType, orDash(sys.Location), strconv.Itoa(sys.Slots)})
	}
	fmt.Fprintln(c.stdout)
	table(c.stdout, []string{"SYSTEM", "SERVER TYPE", "LOCATION", "SLOTS"}, rows)
	printBootBackoff(c, h)
}

// printBootBackoff shows the systems whose VMs did not boot and when
// the next one may.
func printBootBackoff(c *adminCmd, h proxyHetzner) {
	if len(h.BootBackoff) == 0 {
		return
	}
	rows := make([][]string, 0, len(h.BootBackoff))
	for _, b := range h.BootBackoff {
		next := when(b.RetryAt)
		if !b.RetryAt.After(time.Now()) {
			next = "now (one VM at a time until one connects)"
		}
		rows = append(rows, []string{b.System, strconv.Itoa(b.Failures), when(b.LastFailedAt), next})
	}
	fmt.Fprintln(c.stdout, "\nBoot backoff (VMs whose worker did not connect within the boot deadline):")
	table(c.stdout, []string{"SYSTEM", "FAILED BOOTS", "LAST FAILED", "NEXT BOOT"}, rows)
}

func proxyUsage(c *adminCmd) int {
	q := url.Values{}
	for _, f := range []string{"from", "to"} {
		if v := c.cmd.String(f); v != "" {
			q.Set(f, v)
		}
	}
	path := "/api/v1/tenants/" + seg(c.args[0]) + "/usage"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var u struct {
		Tenant        string `json:"tenant"`
		BilledUnits   int    `json:"billed_units"`
		UptimeSeconds int64  `json:"uptime_seconds"`
		VMs           []struct {
			ServerID    int64      `json:"server_id"`
			ServerName  string     `json:"server_name"`
			System      string     `json:"system"`
			ServerType  string     `json:"server_type"`
			CreatedAt   time.Time  `json:"created_at"`
			DeletedAt   *time.Time `json:"deleted_at"`
			Outcome     string     `json:"outcome"`
			BilledUnits int        `json:"billed_units"`
		} `json:"vms"`
	}
	raw, ok := c.call("GET", path, nil, &u)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(u.VMs))
	for _, v := range u.VMs {
		deleted := "-"
		if v.DeletedAt != nil {
			deleted = when(*v.DeletedAt)
		}
		rows = append(rows, []string{strconv.FormatInt(v.ServerID, 10), v.System, v.ServerType, when(v.CreatedAt), deleted,
			v.Outcome, strconv.Itoa(v.BilledUnits)})
	}
	table(c.stdout, []string{"SERVER", "SYSTEM", "TYPE", "CREATED", "DELETED", "OUTCOME", "BILLED UNITS"}, rows)
	fmt.Fprintf(c.stdout, "\n%s: %d VMs, %d billed units, %s of uptime in the period.\n", u.Tenant, len(u.VMs), u.BilledUnits,
		time.Duration(u.UptimeSeconds)*time.Second)
	return exitOK
}
