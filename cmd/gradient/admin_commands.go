package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/urfave/cli/v3"
)

// adminCmd is the state one admin command runs with.
type adminCmd struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
	cmd    *cli.Command // the command's flags
	args   []string     // its positional arguments, as many as it names
	name   string       // e.g. "team worker add", for messages
	json   bool         // --json
	api    *adminClient
}

// adminLeaf is one admin command: its word, usage, positional arguments
// (all required), flags, and what it does once the arguments are checked
// and the API client is ready.
func (a *app) adminLeaf(name, usage string, args []string, flags []cli.Flag, run func(*adminCmd) int) *cli.Command {
	return &cli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: strings.Join(args, " "),
		Flags:     flags,
		Action: func(ctx context.Context, cmd *cli.Command) error {
			pos, ok := a.positional(cmd, args)
			if !ok {
				return exitStatus(exitUsage)
			}
			c := &adminCmd{ctx: ctx, stdout: a.stdout, stderr: a.stderr, cmd: cmd, args: pos,
				name: strings.Join(cmd.Path()[1:], " "), json: cmd.Bool("json")}
			if c.api, ok = a.adminClient(c); !ok {
				return exitStatus(exitUsage)
			}
			return exitWith(run(c))
		},
	}
}

// adminGroup is a command whose subcommands do the work.
func (a *app) adminGroup(name, usage, description string, missing int, subcommands ...*cli.Command) *cli.Command {
	return &cli.Command{
		Name:        name,
		Usage:       usage,
		Description: description,
		Action:      a.groupAction(missing),
		Commands:    subcommands,
	}
}

func (a *app) teamCommand() *cli.Command {
	return a.adminGroup("team", "teams, the workers they own, and the projects that accept those workers", "", exitUsage,
		a.adminLeaf("create", "create a team", []string{"NAME"}, nil, teamCreate),
		a.adminLeaf("list", "list the teams", nil, nil, teamList),
		a.adminLeaf("show", "show a team", []string{"TEAM"}, nil, teamShow),
		a.adminLeaf("delete", "delete a team without projects", []string{"TEAM"}, nil, teamDelete),
		a.adminGroup("worker", "the team's workers", "", exitUsage,
			a.adminLeaf("add", "register a worker of the team and print its token, once", []string{"TEAM"}, registerFlags(), teamWorkerAdd),
			a.adminLeaf("list", "list the team's workers", []string{"TEAM"}, nil, teamWorkerList),
			a.adminLeaf("remove", "remove a worker from the team", []string{"TEAM", "WORKER_ID"}, nil, teamWorkerRemove)),
		a.adminLeaf("grant", "let TEAM's workers run the project's jobs", []string{"TEAM/PROJECT", "TEAM"}, nil, teamGrant),
		a.adminLeaf("revoke", "stop letting TEAM's workers run the project's jobs", []string{"TEAM/PROJECT", "TEAM"}, nil, teamRevoke),
	)
}

func (a *app) projectCommand() *cli.Command {
	return a.adminGroup("project", "projects: a flake repository, its branch, and what to build of it", "", exitUsage,
		a.adminLeaf("create", "create a project", []string{"TEAM/NAME"}, []cli.Flag{
			&cli.StringFlag{Name: "repository", Usage: "flake repository `URL` (required)"},
			&cli.StringFlag{Name: "branch", Usage: "`BRANCH` to evaluate and build", Value: "main"},
			&cli.StringFlag{Name: "wildcards", Usage: "comma-separated attribute `PATTERNS` to build, e.g. 'packages.*.*, checks.x86_64-linux.*'", DefaultText: "packages.x86_64-linux.*"},
		}, projectCreate),
		a.adminLeaf("update", "change what the project's later evaluations build", []string{"PROJECT"}, []cli.Flag{
			&cli.StringFlag{Name: "wildcards", Usage: "comma-separated attribute `PATTERNS` to build from now on, e.g. 'packages.*.*, checks.x86_64-linux.*' (required)"},
		}, projectUpdate),
		a.adminLeaf("list", "list the projects", nil, []cli.Flag{
			&cli.StringFlag{Name: "team", Usage: "only this `TEAM`'s projects"},
		}, projectList),
		a.adminLeaf("show", "show a project", []string{"PROJECT"}, nil, projectShow),
		a.adminLeaf("delete", "delete a project", []string{"PROJECT"}, nil, projectDelete),
		a.adminLeaf("subscribe", "let the project's workers use a cache", []string{"PROJECT", "CACHE"}, nil, projectSubscribe),
		a.adminLeaf("unsubscribe", "stop the project's use of a cache", []string{"PROJECT", "CACHE"}, nil, projectUnsubscribe),
		a.adminLeaf("deploy-key", "make the project's SSH key for private repositories and print its public key", []string{"PROJECT"}, []cli.Flag{
			&cli.BoolFlag{Name: "delete", Usage: "delete the project's deploy key instead"},
		}, projectDeployKey),
		a.forgeCommand(),
		a.adminLeaf("public", "let anyone read the project's evaluations, builds and logs on the dashboard", []string{"PROJECT"}, []cli.Flag{
			&cli.BoolFlag{Name: "off", Usage: "make the project private again"},
		}, projectPublic),
		a.projectRetentionCommand(),
	)
}

func (a *app) cacheCommand() *cli.Command {
	return a.adminGroup("cache", "binary caches: their keys, paths and readers", "", exitUsage,
		a.adminLeaf("create", "create a cache", []string{"NAME"}, []cli.Flag{
			&cli.BoolFlag{Name: "public", Usage: "readable without credentials"},
		}, cacheCreate),
		a.adminLeaf("list", "list the caches", nil, nil, cacheList),
		a.adminLeaf("show", "show a cache", []string{"CACHE"}, nil, cacheShow),
		a.adminLeaf("delete", "delete a cache", []string{"CACHE"}, nil, cacheDelete),
		a.adminLeaf("public-key", "print only the cache's NAME:base64 key", []string{"CACHE"}, nil, cachePublicKey),
		a.adminLeaf("push", "upload a store path (or its closure) from Nix", []string{"CACHE", "STORE_PATH"}, []cli.Flag{
			&cli.BoolFlag{Name: "recursive", Usage: "push the path's whole closure"},
			&cli.StringFlag{Name: "store", Usage: "Nix `STORE` to read from (nix --store)", DefaultText: "the system store"},
			&cli.DurationFlag{Name: "ttl", Usage: "keep the pushed paths only this long (e.g. 72h); default: until deleted"},
		}, cachePush),
		a.adminLeaf("paths", "list the cache's paths", []string{"CACHE"}, nil, cachePaths),
		a.adminLeaf("narinfo", "print the narinfo the cache serves for a path", []string{"CACHE", "STORE_PATH|HASH"}, nil, cacheNarinfo),
		a.adminGroup("key", "API keys for reading a private cache", "", exitUsage,
			a.adminLeaf("create", "make an API key for reading the cache and print it, once", []string{"CACHE"}, nil, cacheKeyCreate)),
		a.cacheGCCommands()[0], a.cacheGCCommands()[1],
	)
}

func (a *app) workerCommand() *cli.Command {
	return a.adminGroup("worker", "worker registrations and the live state of workers", "", exitUsage,
		a.adminLeaf("register", "register a worker for a project, cache or proxy and print its token, once", nil,
			append(peerFlags(), registerFlags()...), workerRegister),
		a.adminLeaf("registrations", "list the workers a project, cache or proxy registered", nil, peerFlags(), workerRegistrations),
		a.adminLeaf("unregister", "remove a registration", []string{"WORKER_ID"}, peerFlags(), workerUnregister),
		a.adminLeaf("list", "live state of the project's workers", nil, []cli.Flag{
			&cli.StringFlag{Name: "project", Usage: "the `PROJECT`, TEAM/PROJECT or UUID (required)"},
		}, workerList),
		a.adminLeaf("show", "show a worker: live state and registrations", []string{"WORKER_ID"}, nil, workerShow),
		a.adminLeaf("deactivate", "refuse the worker's connections from now on", []string{"WORKER_ID"}, nil, workerDeactivate),
		a.adminLeaf("activate", "accept the worker's connections again", []string{"WORKER_ID"}, nil, workerActivate),
	)
}

func (a *app) serverCommand() *cli.Command {
	return a.adminGroup("server", "the server's connection state", "", exitUsage,
		a.adminLeaf("status", "whether the server accepts workers, and how many are connected", nil, nil, serverStatus),
		a.adminLeaf("stop-accepting", "refuse new worker connections (403)", nil, nil, serverStopAccepting),
		a.adminLeaf("resume-accepting", "accept new worker connections again", nil, nil, serverResumeAccepting),
	)
}

// call runs one API call, printing the server's error sentence on failure.
func (c *adminCmd) call(method, path string, body, out any) ([]byte, bool) {
	raw, err := c.api.call(c.ctx, method, path, body, out)
	if err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: %v\n", c.name, err)
		return nil, false
	}
	return raw, true
}

// printJSON writes the server's JSON answer as is (it is indented).
func (c *adminCmd) printJSON(raw []byte) int {
	c.stdout.Write(raw)
	if len(raw) > 0 && raw[len(raw)-1] != '\n' {
		io.WriteString(c.stdout, "\n")
	}
	return exitOK
}

// done reports a change without a response body (delete, revoke): as a
// sentence, or as {"ok": true, ...} for --json.
func (c *adminCmd) done(sentence string) int {
	if c.json {
		j, _ := json.Marshal(map[string]any{"ok": true, "message": sentence})
		fmt.Fprintf(c.stdout, "%s\n", j)
		return exitOK
	}
	fmt.Fprintln(c.stdout, sentence)
	return exitOK
}

// Path segments. A project TEAM/NAME is one segment with the slash
// escaped, as the API expects.
func seg(s string) string { return url.PathEscape(s) }
