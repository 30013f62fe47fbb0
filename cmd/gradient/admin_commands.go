package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
)

const adminUsage = `Admin commands (talk to gradient-server's admin API):
  team create NAME | list | show TEAM | delete TEAM
  team worker add TEAM [--worker-id UUID] [--url URL] [--no-fetch] [--no-eval] [--no-build]
  team worker list TEAM | remove TEAM WORKER_ID
  team grant TEAM/PROJECT TEAM     let TEAM's workers run the project's jobs
  team revoke TEAM/PROJECT TEAM
  project create TEAM/NAME --repository URL [--branch main] [--wildcards PATTERNS]
  project update PROJECT --wildcards PATTERNS
                                   what later evaluations build, e.g.
                                   'packages.*.*, checks.x86_64-linux.*'
  project list [--team TEAM] | show PROJECT | delete PROJECT
  project subscribe PROJECT CACHE | unsubscribe PROJECT CACHE
  project deploy-key PROJECT [--delete]
                                   SSH key for private repositories (prints the public key)
  cache create NAME [--public] | list | show CACHE | delete CACHE
  cache public-key CACHE           print only the NAME:base64 key
  cache push CACHE STORE_PATH [--recursive] [--store STORE]
                                   upload a path (or its closure) from Nix
  cache paths CACHE | narinfo CACHE STORE_PATH|HASH
  cache key create CACHE           API key for reading a private cache, once
  worker register --project PROJECT|--cache CACHE|--proxy ID
                  [--worker-id UUID] [--url URL] [--no-fetch] [--no-eval] [--no-build]
  worker registrations --project PROJECT|--cache CACHE|--proxy ID
  worker unregister --project PROJECT|--cache CACHE|--proxy ID WORKER_ID
  worker list --project PROJECT    live state of the project's workers
  worker show WORKER_ID | deactivate WORKER_ID | activate WORKER_ID
  server status | stop-accepting | resume-accepting

A PROJECT is TEAM/NAME or the project's UUID; teams and caches are names or
UUIDs. Every admin command takes:
  --server URL        (env GRADIENT_SERVER, default http://127.0.0.1:3000)
  --token TOKEN       (env GRADIENT_ADMIN_TOKEN)
  --token-file FILE   (env GRADIENT_ADMIN_TOKEN_FILE)
  --json              print the server's JSON instead of text
`

// adminCommand runs one admin command on its arguments after the words
// that name it.
type adminCommand func(c *adminCmd, args []string) int

// adminCommands maps command words to commands.
var adminCommands = map[string]adminCommand{
	"team create":        teamCreate,
	"team list":          teamList,
	"team show":          teamShow,
	"team delete":        teamDelete,
	"team worker add":    teamWorkerAdd,
	"team worker list":   teamWorkerList,
	"team worker remove": teamWorkerRemove,
	"team grant":         teamGrant,
	"team revoke":        teamRevoke,

	"project create":      projectCreate,
	"project list":        projectList,
	"project show":        projectShow,
	"project update":      projectUpdate,
	"project delete":      projectDelete,
	"project subscribe":   projectSubscribe,
	"project unsubscribe": projectUnsubscribe,
	"project deploy-key":  projectDeployKey,

	"cache create":     cacheCreate,
	"cache list":       cacheList,
	"cache show":       cacheShow,
	"cache delete":     cacheDelete,
	"cache public-key": cachePublicKey,
	"cache push":       cachePush,
	"cache paths":      cachePaths,
	"cache narinfo":    cacheNarinfo,
	"cache key create": cacheKeyCreate,

	"worker register":      workerRegister,
	"worker registrations": workerRegistrations,
	"worker unregister":    workerUnregister,
	"worker list":          workerList,
	"worker show":          workerShow,
	"worker deactivate":    workerDeactivate,
	"worker activate":      workerActivate,

	"server status":           serverStatus,
	"server stop-accepting":   serverStopAccepting,
	"server resume-accepting": serverResumeAccepting,
}

// isAdminGroup reports whether word starts an admin command.
func isAdminGroup(word string) bool {
	return slices.Contains([]string{"team", "project", "cache", "worker", "server", "eval", "build"}, word)
}

// adminCmd is the state one admin command runs with.
type adminCmd struct {
	ctx      context.Context
	getenv   func(string) string
	stdout   io.Writer
	stderr   io.Writer
	settings adminSettings // from flags before the command, then its own
	name     string        // e.g. "team worker add", for messages
	api      *adminClient
}

// runAdmin finds the command named by the leading words of args.
func runAdmin(ctx context.Context, settings adminSettings, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	for n := min(3, len(args)); n >= 1; n-- {
		name := strings.Join(args[:n], " ")
		if cmd, ok := adminCommands[name]; ok {
			c := &adminCmd{ctx: ctx, getenv: getenv, stdout: stdout, stderr: stderr, settings: settings, name: name}
			return cmd(c, args[n:])
		}
	}
	fmt.Fprintf(stderr, "gradient: unknown command %q\n\n%s", strings.Join(args, " "), adminUsage)
	return exitUsage
}

// parse parses the command's flags (fs from c.flags) and requires exactly
// the positional arguments named by want. On success the API client is
// ready in c.api.
func (c *adminCmd) parse(fs *flag.FlagSet, args []string, want ...string) ([]string, int, bool) {
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, exitOK, false
		}
		return nil, exitUsage, false
	}
	if len(pos) != len(want) {
		expected := "no arguments"
		if len(want) > 0 {
			expected = strings.Join(want, " ")
		}
		fmt.Fprintf(c.stderr, "gradient %s: want %s, got %d argument(s)\n", c.name, expected, len(pos))
		return nil, exitUsage, false
	}
	for i, p := range pos {
		if strings.TrimSpace(p) == "" {
			fmt.Fprintf(c.stderr, "gradient %s: %s is empty\n", c.name, want[i])
			return nil, exitUsage, false
		}
	}
	api, err := c.settings.client(c.getenv)
	if err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: %v\n", c.name, err)
		return nil, exitUsage, false
	}
	c.api = api
	return pos, exitOK, true
}

// flags returns the command's flag set with the admin settings on it.
func (c *adminCmd) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("gradient "+c.name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	c.settings.register(fs)
	return fs
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
	if c.settings.json {
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
