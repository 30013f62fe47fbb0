package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/urfave/cli/v3"
)

// The `gradient proxy …` commands are thin clients of gradient-proxy's
// admin API (proxy/admin). They talk to the proxy named by --proxy
// (GRADIENT_PROXY_URL) with the proxy's own admin token, --proxy-token or
// --proxy-token-file (GRADIENT_PROXY_ADMIN_TOKEN, _FILE): never the
// server's --token, which must not travel to another service.

const defaultProxy = "http://127.0.0.1:3200"

var proxyToken = tokenFlags{token: "proxy-token", file: "proxy-token-file",
	tokenVar: "GRADIENT_PROXY_ADMIN_TOKEN", fileVar: "GRADIENT_PROXY_ADMIN_TOKEN_FILE"}

const proxyDescription = `Operates a gradient-proxy (the federation proxy) through its admin API.
A TENANT is its name or UUID; a worker is its UUID.

Connection, before or after the command:
   --proxy URL                gradient-proxy's URL (default: "` + defaultProxy + `") [$GRADIENT_PROXY_URL]
   --proxy-token TOKEN        the proxy's admin token [$GRADIENT_PROXY_ADMIN_TOKEN]
   --proxy-token-file FILE    file holding it [$GRADIENT_PROXY_ADMIN_TOKEN_FILE]
   --json                     print the proxy's JSON instead of text
The server's --server, --token and --token-file (and their variables) are
refused or ignored here: the proxy has its own admin token.

A deployment: the tenant registers a worker ID for the proxy on their server
(gradient worker register --project TEAM/PROJECT) and hands over the worker
ID and the peers line PROJECT_ID:TOKEN; the operator runs
  gradient proxy tenant create acme
  gradient proxy link set acme --url wss://ci.acme.example/proto --worker-id ID --peers-file acme.peers
  gradient proxy worker create acme --name builder-1
and starts gradient-worker on each machine with --id WORKER_ID --server-url ws://PROXY/proto
and a peers file holding the WORKER_ID:TOKEN line worker create printed.`

func (a *app) proxyCommand() *cli.Command {
	url, token, tokenFile := a.proxyOrigin("proxy"), a.proxyOrigin("proxy-token"), a.proxyOrigin("proxy-token-file")
	return &cli.Command{
		Name:        "proxy",
		Usage:       "gradient-proxy's tenants, upstream links, workers and sessions",
		Description: proxyDescription,
		Metadata:    map[string]any{metaProxy: true},
		Action:      a.groupAction(exitUsage),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "proxy", Usage: "gradient-proxy's `URL`", Value: defaultProxy,
				Sources: a.trackedEnv("GRADIENT_PROXY_URL", url), Validator: countSets[string](url)},
			&cli.StringFlag{Name: "proxy-token", Usage: "the proxy's admin `TOKEN`",
				Sources: a.trackedEnv(proxyToken.tokenVar, token), Validator: countSets[string](token)},
			&cli.StringFlag{Name: "proxy-token-file", Usage: "`FILE` holding the proxy's admin token", TakesFile: true,
				Sources: a.trackedEnv(proxyToken.fileVar, tokenFile), Validator: countSets[string](tokenFile)},
		},
		Commands: []*cli.Command{
			a.adminGroup("tenant", "tenants: the customers whose servers the proxy serves as one worker", "", exitUsage,
				a.proxyLeaf("create", "create a tenant (it may run)", []string{"NAME"}, nil, proxyTenantCreate),
				a.proxyLeaf("list", "list the tenants", nil, nil, proxyTenantList),
				a.proxyLeaf("show", "show a tenant with its link and number of workers", []string{"TENANT"}, nil, proxyTenantShow),
				a.proxyLeaf("delete", "delete a tenant: revokes its workers (their sessions close), stops its upstream session", []string{"TENANT"}, nil, proxyTenantDelete),
				a.proxyLeaf("may-run", "let the tenant run (on) or stop its upstream session (off)", []string{"TENANT", "on|off"}, nil, proxyTenantMayRun)),
			a.adminGroup("link", "the tenants' upstream links: their server's /proto URL, the proxy's worker ID there, its tokens", "", exitUsage,
				a.proxyLeaf("set", "set the tenant's link from the peers file the tenant handed over (clears a failing state)", []string{"TENANT"}, []cli.Flag{
					&cli.StringFlag{Name: "url", Usage: "the tenant server's ws:// or wss:// /proto `URL` (required)"},
					&cli.StringFlag{Name: "worker-id", Usage: "the proxy's worker `UUID` on the tenant's server (required)"},
					&cli.StringFlag{Name: "peers-file", Usage: "`FILE` of PEER_ID:TOKEN lines the tenant handed over (required)", TakesFile: true},
				}, proxyLinkSet),
				a.proxyLeaf("enable", "let the link connect", []string{"TENANT"}, nil, proxyLinkEnable),
				a.proxyLeaf("disable", "stop the link's upstream session", []string{"TENANT"}, nil, proxyLinkDisable),
				a.proxyLeaf("status", "show the link: state, reason, since when, and its session", []string{"TENANT"}, nil, proxyLinkStatus)),
			a.adminGroup("worker", "the proxy's own workers", "", exitUsage,
				a.proxyLeaf("create", "authorize a worker for the tenant and print its ID and token, once", []string{"TENANT"}, []cli.Flag{
					&cli.StringFlag{Name: "name", Usage: "the worker's `NAME`, unique within the tenant (required)"},
					&cli.StringFlag{Name: "capabilities", Usage: "comma-separated `LIST` of what it may do: fetch, eval, build", Value: "fetch,eval,build"},
				}, proxyWorkerCreate),
				a.proxyLeaf("list", "list the proxy's workers with their live state", nil, []cli.Flag{
					&cli.StringFlag{Name: "tenant", Usage: "only this `TENANT`'s workers"},
				}, proxyWorkerList),
				a.proxyLeaf("revoke", "delete the worker's authorization and close its session", []string{"WORKER_ID"}, nil, proxyWorkerRevoke)),
			a.adminGroup("hetzner", "the tenants' Hetzner Cloud workers", "", exitUsage,
				a.proxyLeaf("set", "set the tenant's Hetzner configuration (replacing the one before)", []string{"TENANT"}, proxyHetznerFlags(), proxyHetznerSet),
				a.proxyLeaf("show", "show the tenant's Hetzner configuration", []string{"TENANT"}, nil, proxyHetznerShow)),
			a.proxyLeaf("usage", "the tenant's VMs in a period with their billed units", []string{"TENANT"}, []cli.Flag{
				&cli.StringFlag{Name: "from", Usage: "start of the period: RFC 3339 `TIME` or a date (2026-12-01)"},
				&cli.StringFlag{Name: "to", Usage: "end of the period (exclusive): RFC 3339 `TIME` or a date"},
			}, proxyUsage),
			a.proxyLeaf("sessions", "the live sessions: upstream to tenants' servers, downstream of the proxy's workers", nil, nil, proxySessions),
		},
	}
}

func (a *app) proxyOrigin(name string) *flagOrigin {
	o := &flagOrigin{}
	a.origins[name] = o
	return o
}

// proxyLeaf is an admin command against the proxy: adminLeaf's checks,
// with the proxy's URL and token.
func (a *app) proxyLeaf(name, usage string, args []string, flags []cli.Flag, run func(*adminCmd) int) *cli.Command {
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: strings.Join(args, " "),
		Flags:     flags,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			for _, server := range []string{"server", "token", "token-file"} {
				if a.givenOnCommandLine(server) {
					fmt.Fprintf(a.stderr, "%s: --%s names gradient-server; the proxy's are --proxy, --proxy-token and --proxy-token-file\n",
						cmd.FullName(), server)
					return exitStatus(exitUsage)
				}
			}
			pos, ok := a.positional(cmd, args)
			if !ok {
				return exitStatus(exitUsage)
			}
			c := &adminCmd{ctx: ctx, stdout: a.stdout, stderr: a.stderr, cmd: cmd, args: pos,
				name: strings.Join(cmd.Path()[1:], " "), json: cmd.Bool("json")}
			token, err := a.tokenOf(c, proxyToken)
			if err != nil {
				fmt.Fprintf(c.stderr, "gradient %s: %v\n", c.name, err)
				return exitStatus(exitUsage)
			}
			base := cmd.String("proxy")
			if base == "" {
				base = defaultProxy
			}
			c.api = &adminClient{base: strings.TrimRight(base, "/"), token: token, http: http.DefaultClient, service: "proxy"}
			return exitWith(run(c))
		},
	}
}
