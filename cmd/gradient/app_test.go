package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/internal/clitest"
	"gradient.dev/gradient/wire"
)

// perInvocationFlags are the flags without an environment variable: each
// describes one request (what to create, which commit, how to print),
// not how the tool runs from one invocation to the next, so a variable
// would silently change requests. Every other flag has a variable, as
// --server, --token and --token-file, and gradient up's settings do.
var perInvocationFlags = map[string]string{
	"gradient --json": "the output format of one command",

	"gradient wire decode --side":    "describes the input on stdin",
	"gradient wire decode --version": "describes the input on stdin",
	"gradient wire encode --side":    "describes the input on stdin",
	"gradient wire encode --version": "describes the input on stdin",
	"gradient wire schema --version": "which schema to print",

	"gradient up --serve":     "what this run does after building",
	"gradient up --wildcards": "what this run builds",

	"gradient team worker add --worker-id": "the registration being made",
	"gradient team worker add --url":       "the registration being made",
	"gradient team worker add --no-fetch":  "the registration being made",
	"gradient team worker add --no-eval":   "the registration being made",
	"gradient team worker add --no-build":  "the registration being made",

	"gradient project create --repository": "the project being created",
	"gradient project create --branch":     "the project being created",
	"gradient project create --wildcards":  "the project being created",
	"gradient project update --wildcards":  "the change being made",
	"gradient project list --team":         "a filter of one listing",
	"gradient project deploy-key --delete": "which action this command takes",

	"gradient project forge set --kind":               "the link being set",
	"gradient project forge set --repository":         "the link being set",
	"gradient project forge set --api-url":            "the link being set",
	"gradient project forge set --forge-token-file":   "the link being set",
	"gradient project forge set --app-id":             "the link being set",
	"gradient project forge set --app-key-file":       "the link being set",
	"gradient project forge set --trust":              "the link being set",
	"gradient project forge set --per-build-statuses": "the link being set",

	"gradient cache create --public":          "the cache being created",
	"gradient cache push --recursive":         "what this push uploads",
	"gradient cache push --store":             "where this push's path is",
	"gradient worker register --project":      "the registration being made",
	"gradient worker register --cache":        "the registration being made",
	"gradient worker register --proxy":        "the registration being made",
	"gradient worker register --worker-id":    "the registration being made",
	"gradient worker register --url":          "the registration being made",
	"gradient worker register --no-fetch":     "the registration being made",
	"gradient worker register --no-eval":      "the registration being made",
	"gradient worker register --no-build":     "the registration being made",
	"gradient worker registrations --project": "the peer whose registrations are listed",
	"gradient worker registrations --cache":   "the peer whose registrations are listed",
	"gradient worker registrations --proxy":   "the peer whose registrations are listed",
	"gradient worker unregister --project":    "the registration being removed",
	"gradient worker unregister --cache":      "the registration being removed",
	"gradient worker unregister --proxy":      "the registration being removed",
	"gradient worker list --project":          "the project whose workers are listed",

	"gradient eval start --commit":        "the commit of this evaluation",
	"gradient eval start --wait":          "whether this command follows its evaluation",
	"gradient eval start --wait-interval": "how this command follows its evaluation",
	"gradient eval list --limit":          "the length of one listing",

	"gradient proxy link set --url":                 "the link being set",
	"gradient proxy link set --worker-id":           "the link being set",
	"gradient proxy link set --peers-file":          "the link being set",
	"gradient proxy worker create --name":           "the worker being created",
	"gradient proxy worker create --capabilities":   "the worker being created",
	"gradient proxy worker list --tenant":           "a filter of one listing",
	"gradient proxy hetzner set --enabled":          "the configuration being set",
	"gradient proxy hetzner set --max-vms":          "the configuration being set",
	"gradient proxy hetzner set --system":           "the configuration being set",
	"gradient proxy hetzner set --snapshot-id":      "the configuration being set",
	"gradient proxy hetzner set --snapshot-label":   "the configuration being set",
	"gradient proxy hetzner set --ssh-key":          "the configuration being set",
	"gradient proxy hetzner set --label":            "the configuration being set",
	"gradient proxy hetzner set --capabilities":     "the configuration being set",
	"gradient proxy usage --from":                   "the period of one report",
	"gradient proxy usage --to":                     "the period of one report",
	"gradient project public --off":                 "one change",
	"gradient token create --scope":                 "the token's scope",
	"gradient cache gc --dry-run":                   "one collection",
	"gradient cache retention --max-bytes":          "the setting being set",
	"gradient cache retention --no-cap":             "the setting being set",
	"gradient project retention --keep-evaluations": "the setting being set",
	"gradient project retention --default":          "the setting being set",
	"gradient cache push --ttl":                     "the paths being pushed",
}

// TestEveryFlagHasAVariable walks every command of the CLI: each flag has
// an environment variable or is a listed per-invocation flag, never both,
// and the list names only flags that exist.
func TestEveryFlagHasAVariable(t *testing.T) {
	a := &app{ctx: context.Background(), getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard}
	seen := map[string]bool{}
	for _, f := range clitest.Flags(a.rootCommand()) {
		key := f.Command + " --" + f.Flag.Names()[0]
		seen[key] = true
		vars := clitest.Variables(f.Flag)
		_, listed := perInvocationFlags[key]
		switch {
		case len(vars) == 0 && !listed:
			t.Errorf("%s has no environment variable and is not a per-invocation flag", key)
		case len(vars) > 0 && listed:
			t.Errorf("%s has the variable %v but is listed as per-invocation", key, vars)
		}
		for _, v := range vars {
			if !strings.HasPrefix(v, "GRADIENT_") {
				t.Errorf("%s: variable %s lacks the GRADIENT_ prefix", key, v)
			}
		}
	}
	for key := range perInvocationFlags {
		if !seen[key] {
			t.Errorf("perInvocationFlags lists %s, which does not exist", key)
		}
	}
	for _, key := range []string{"gradient --server", "gradient --token", "gradient --token-file", "gradient up --data-dir"} {
		if !seen[key] {
			t.Errorf("no flag %s", key)
		}
	}
}

// TestHelpListsFlagsWithVariablesAndDefaults samples -h on the root, a
// group, and leaves.
func TestHelpListsFlagsWithVariablesAndDefaults(t *testing.T) {
	env := map[string]string{"GRADIENT_ADMIN_TOKEN": "never-shown-token", "GRADIENT_SERVER": "http://server.invalid"}
	for _, c := range []struct {
		args   []string
		stderr bool // gradient up keeps its stdout for the summary
		want   []string
		not    []string
	}{
		{args: []string{"-h"}, want: []string{"Usage: gradient", "team worker add TEAM", "wire decode", "up [FLAKE]",
			"--server URL", `(default: "http://127.0.0.1:3000") [$GRADIENT_SERVER]`, "--token TOKEN", "[$GRADIENT_ADMIN_TOKEN]",
			"--token-file FILE", "[$GRADIENT_ADMIN_TOKEN_FILE]", "gradient completion bash"}},
		{args: []string{"help"}, want: []string{"Usage: gradient", "eval start PROJECT"}},
		{args: []string{"project", "-h"}, want: []string{"Usage: gradient project <command>", "project create TEAM/NAME", "project deploy-key PROJECT", "[$GRADIENT_SERVER]"}},
		{args: []string{"help", "project"}, want: []string{"Usage: gradient project <command>"}},
		{args: []string{"project", "create", "-h"}, want: []string{"Usage: gradient project create [options] TEAM/NAME",
			"--repository URL", "--wildcards PATTERNS", "(default: packages.x86_64-linux.*)", `--branch BRANCH`, `(default: "main")`,
			"--server URL", "[$GRADIENT_ADMIN_TOKEN_FILE]"}},
		{args: []string{"eval", "list", "--help"}, want: []string{"--limit int", "(default: 20)"}},
		{args: []string{"up", "-h"}, stderr: true, want: []string{"Usage: gradient up [options] [FLAKE]",
			"--workers int", "(default: 2) [$GRADIENT_UP_WORKERS]", "--data-dir DIR", "[$GRADIENT_UP_DATA_DIR]",
			"--timeout duration", "(default: 30m0s) [$GRADIENT_UP_TIMEOUT]", "--wildcards PATTERNS", "(default: packages.<system>.*)"},
			not: []string{"--server", "--token"}},
		{args: []string{"wire", "decode", "-h"}, want: []string{"Usage: gradient wire decode", "--side DIRECTION",
			"--version N", fmt.Sprintf("(default: %d)", wire.NewestVersion)}, not: []string{"--server", "--json"}},
	} {
		code, out, errOut := gradientEnv(t, env, c.args...)
		help, other := out, errOut
		if c.stderr {
			help, other = errOut, out
		}
		if code != exitOK || other != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", c.args, code, out, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(help, w) {
				t.Errorf("%v: help lacks %q:\n%s", c.args, w, help)
			}
		}
		for _, n := range append(c.not, "never-shown-token", "server.invalid") {
			if strings.Contains(help, n) {
				t.Errorf("%v: help shows %q:\n%s", c.args, n, help)
			}
		}
	}
}

// TestFlagErrorsNameTheFlag: a bad value on the command line or in a
// variable is a usage error that names the flag as users type it.
func TestFlagErrorsNameTheFlag(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		args []string
		want []string
	}{
		{nil, []string{"eval", "list", "X", "--limit", "abc"}, []string{"gradient eval list:", `invalid value "abc" for flag --limit`}},
		{nil, []string{"wire", "schema", "--version", "x"}, []string{"flag --version"}},
		{nil, []string{"eval", "start", "ops/web", "--wait-interval"}, []string{"flag needs an argument: --wait-interval"}},
		{nil, []string{"--bogus", "team", "list"}, []string{"flag provided but not defined: --bogus"}},
		{map[string]string{"GRADIENT_UP_WORKERS": "many"}, []string{"up"}, []string{`"many"`, "GRADIENT_UP_WORKERS", "flag --workers"}},
	} {
		code, out, errOut := gradientEnv(t, c.env, c.args...)
		if code != exitUsage || out != "" {
			t.Errorf("%v: exit %d, stdout %q; want 2 and nothing", c.args, code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr %q lacks %q", c.args, errOut, w)
			}
		}
	}
}

// TestBareBooleanFlags: a bare boolean flag means true, --flag=false
// turns it off, on the command line and in a variable.
func TestBareBooleanFlags(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	var on, off cacheInfo
	s.okJSON(t, &on, "cache", "create", "open", "--public")
	s.okJSON(t, &off, "cache", "create", "closed", "--public=false")
	if !on.Public || off.Public {
		t.Errorf("--public made public=%v, --public=false made public=%v", on.Public, off.Public)
	}
	mustContain(t, s.ok(t, "cache", "list", "--json=false"), "CACHE", "PUBLIC")

	for _, c := range []struct {
		env  string
		args []string
		want bool
	}{
		{"", []string{"--verbose"}, true},
		{"", []string{"--verbose=false"}, false},
		{"true", nil, true},
		{"false", nil, false},
		{"true", []string{"--verbose=false"}, false},
	} {
		env := map[string]string{"GRADIENT_UP_VERBOSE": c.env}
		o, ok := parseUpEnv(t, env, c.args...)
		if !ok || o.verbose != c.want {
			t.Errorf("GRADIENT_UP_VERBOSE=%q %v: verbose %v (parsed %v), want %v", c.env, c.args, o.verbose, ok, c.want)
		}
	}
}

// parseUpEnv parses gradient up's arguments in the environment env.
func parseUpEnv(t *testing.T, env map[string]string, args ...string) (upOptions, bool) {
	t.Helper()
	var parsed upOptions
	ran := false
	a := &app{ctx: t.Context(), getenv: func(k string) string { return env[k] }, stdout: io.Discard, stderr: io.Discard,
		up: func(_ context.Context, o upOptions, _, _ io.Writer) int { parsed, ran = o, true; return exitOK }}
	a.run(append([]string{"up"}, args...))
	return parsed, ran
}

func TestUpVariables(t *testing.T) {
	env := map[string]string{"GRADIENT_UP_WORKERS": "5", "GRADIENT_UP_DATA_DIR": "/tmp/up-data", "GRADIENT_UP_TIMEOUT": "90s",
		"GRADIENT_UP_LISTEN": "127.0.0.1:4000", "GRADIENT_UP_STORE": "/tmp/up-store"}
	o, ok := parseUpEnv(t, env)
	if !ok || o.workers != 5 || o.dataDir != "/tmp/up-data" || o.timeout.String() != "1m30s" || o.listen != "127.0.0.1:4000" || o.store != "/tmp/up-store" {
		t.Errorf("from variables: %+v (parsed %v)", o, ok)
	}
	// A flag wins over its variable.
	if o, ok := parseUpEnv(t, env, "--workers", "1", "./flake"); !ok || o.workers != 1 || o.flake != "./flake" {
		t.Errorf("flag over variable: %+v (parsed %v)", o, ok)
	}
}

// TestTokenFlagOverridesBothVariables: --token on the command line wins
// over GRADIENT_ADMIN_TOKEN_FILE too, and --token-file over
// GRADIENT_ADMIN_TOKEN, wherever the flag stands.
func TestTokenFlagOverridesBothVariables(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(cliAdminToken), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct {
		env  map[string]string
		args []string
	}{
		{map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN_FILE": missing}, []string{"--token", cliAdminToken, "team", "list"}},
		{map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN_FILE": missing}, []string{"team", "list", "--token", cliAdminToken}},
		{map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN": "wrong"}, []string{"--token-file", file, "team", "list"}},
		// The flag's value may equal its variable's.
		{map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN": cliAdminToken, "GRADIENT_ADMIN_TOKEN_FILE": missing},
			[]string{"team", "list", "--token", cliAdminToken}},
	} {
		if code, _, errOut := gradientEnv(t, c.env, c.args...); code != exitOK {
			t.Errorf("%v with %v: exit %d, stderr %q", c.args, c.env, code, errOut)
		}
	}
	// Both variables without a flag stay a mistake.
	code, _, errOut := gradientEnv(t, map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN": cliAdminToken, "GRADIENT_ADMIN_TOKEN_FILE": file}, "team", "list")
	if code != exitUsage || !strings.Contains(errOut, "not both") {
		t.Errorf("both variables: exit %d, stderr %q", code, errOut)
	}
	// --server after wire is as wrong as before it.
	code, _, errOut = gradientEnv(t, s.env(), "wire", "versions", "--server", s.url)
	if code != exitUsage || !strings.Contains(errOut, "go with an admin command") {
		t.Errorf("wire versions --server: exit %d, stderr %q", code, errOut)
	}
}

func TestShellCompletion(t *testing.T) {
	code, script, errOut := gradientEnv(t, nil, "completion", "bash")
	if code != exitOK || errOut != "" || !strings.Contains(script, "complete ") || !strings.Contains(script, "gradient") {
		t.Fatalf("completion bash: exit %d, stderr %q, script %q", code, errOut, script)
	}
	for _, shell := range []string{"zsh", "fish"} {
		if code, out, _ := gradientEnv(t, nil, "completion", shell); code != exitOK || !strings.Contains(out, "gradient") {
			t.Errorf("completion %s: exit %d, %q", shell, code, out)
		}
	}
	words := func(args ...string) []string {
		t.Helper()
		code, out, errOut := gradientEnv(t, nil, append(args, "--generate-shell-completion")...)
		if code != exitOK || errOut != "" {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errOut)
		}
		var ws []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			w, _, _ := strings.Cut(line, ":")
			ws = append(ws, w)
		}
		return ws
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"up", "wire", "team", "project", "cache", "worker", "server", "eval", "build"}},
		{[]string{"team"}, []string{"create", "list", "show", "delete", "worker", "grant", "revoke"}},
		{[]string{"--server", "http://x", "cache", "key"}, []string{"create"}},
		{[]string{"--se"}, []string{"--server"}},
		{[]string{"project", "create", "--rep"}, []string{"--repository"}},
	} {
		got := words(c.args...)
		for _, w := range c.want {
			if !slices.Contains(got, w) {
				t.Errorf("completing %v: got %v, want %q among them", c.args, got, w)
			}
		}
	}
}
