package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v3"

	"gradient.dev/gradient/internal/clitest"
	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/internal/servicecli"
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/wire"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDefaults(t *testing.T) {
	opts, err := parseOptions([]string{"--encryption-key-file", "/run/keys/proxy"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{HTTP: defaultHTTP, Listen: "127.0.0.1:3200", Database: mustAbs(t, "gradient-proxy-data"), EncryptionKeyFile: "/run/keys/proxy",
		UpstreamCapabilities: wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}, AuthFailures: 30, Tenant: hub.DefaultLimits, Hetzner: defaultHetzner(),
		LogLevel: slog.LevelInfo, LogFormat: "text"}
	if !reflect.DeepEqual(opts, want) {
		t.Errorf("got  %+v\nwant %+v", opts, want)
	}
}

func TestEnvironmentAndFlags(t *testing.T) {
	tokenFile := writeFile(t, "admin", "  the-admin-token\n")
	env := envOf(map[string]string{
		"GRADIENT_PROXY_LISTEN": "0.0.0.0:9", "GRADIENT_PROXY_DATABASE": "postgres://proxy@db/proxy",
		"GRADIENT_PROXY_ENCRYPTION_KEY_FILE": "/env/key", "GRADIENT_PROXY_ADMIN_TOKEN_FILE": tokenFile,
		"GRADIENT_PROXY_UPSTREAM_CAPABILITIES": "build", "GRADIENT_PROXY_LOG_FORMAT": "json",
		"GRADIENT_PROXY_AUTH_FAILURES_PER_MINUTE": "5", "GRADIENT_PROXY_TENANT_MAX_CANDIDATE_MIB": "64", "GRADIENT_PROXY_HTTP_IDLE_TIMEOUT": "30",
	})
	opts, err := parseOptions([]string{"--listen", "127.0.0.1:4000", "--upstream-capabilities", "eval, fetch", "--log-level", "debug",
		"--tenant-max-candidates", "5000"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{HTTP: httpguard.Timeouts{Header: httpguard.DefaultHeaderTimeout, Body: httpguard.DefaultBodyTimeout, Idle: 30 * time.Second},
		Listen: "127.0.0.1:4000", Database: "postgres://proxy@db/proxy", EncryptionKeyFile: "/env/key", AdminToken: "the-admin-token",
		UpstreamCapabilities: wire.GradientCapabilities{Fetch: true, Eval: true}, AuthFailures: 5,
		Tenant:   hub.Limits{BookCandidates: 5000, BookBytes: 64 << 20, PendingQueries: hub.DefaultLimits.PendingQueries, PendingUploads: hub.DefaultLimits.PendingUploads},
		Hetzner:  defaultHetzner(),
		LogLevel: slog.LevelDebug, LogFormat: "json"}
	if !reflect.DeepEqual(opts, want) {
		t.Errorf("got  %+v\nwant %+v", opts, want)
	}
}

func TestInvalidOptions(t *testing.T) {
	empty := writeFile(t, "empty", "\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--encryption-key-file"},
		{[]string{"--encryption-key-file", "k", "--upstream-capabilities", "build,cache"}, `unknown capability "cache"`},
		{[]string{"--encryption-key-file", "k", "--upstream-capabilities", "federate"}, "at least one of fetch, eval and build"},
		{[]string{"--encryption-key-file", "k", "--admin-token-file", empty}, "is empty"},
		{[]string{"--encryption-key-file", "k", "--admin-token-file", empty + ".missing"}, "admin token file"},
		{[]string{"--encryption-key-file", "k", "--database", ""}, "may not be empty"},
		{[]string{"--encryption-key-file", "k", "stray"}, `unexpected argument "stray"`},
		{[]string{"--encryption-key-file", "k", "--auth-failures-per-minute", "-1"}, "auth-failures-per-minute: want a number ≥ 0"},
		{[]string{"--encryption-key-file", "k", "--tenant-max-candidates", "0"}, "tenant-max-candidates"},
	} {
		var stderr strings.Builder
		if _, err := parseOptions(c.args, envOf(nil), &stderr); err != servicecli.ErrUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: got %v, stderr %q; want a usage error naming %q", c.args, err, stderr.String(), c.want)
		}
	}
}

func proxyCommand() *cli.Command {
	var opts options
	var raw rawOptions
	var logging servicecli.Logging
	return command(&opts, &raw, servicecli.NewEnv(envOf(nil)), &logging)
}

func TestEveryFlagHasAVariable(t *testing.T) {
	clitest.EveryFlagHasAVariable(t, proxyCommand())
}

func TestHelpListsEveryVariable(t *testing.T) {
	var stderr strings.Builder
	if _, err := parseOptions([]string{"-h"}, envOf(nil), &stderr); err != servicecli.ErrHelp {
		t.Fatalf("-h: %v", err)
	}
	clitest.HelpListsEveryVariable(t, proxyCommand(), stderr.String())
	for _, planned := range []string{"/healthz and /metrics", "the admin API under /api/v1", "Jobs are forwarded per tenant",
		"gradient worker register --project", "gradient proxy link set", "gradient proxy worker create", "--server-url ws://PROXY:3200/proto"} {
		if !strings.Contains(stderr.String(), planned) {
			t.Errorf("-h does not say %q:\n%s", planned, stderr.String())
		}
	}
}

func TestHetznerOptions(t *testing.T) {
	tokenFile := writeFile(t, "hcloud", "hc-token\n")
	env := envOf(map[string]string{
		"GRADIENT_PROXY_ENCRYPTION_KEY_FILE": "/k", "GRADIENT_PROXY_HETZNER_TOKEN_FILE": tokenFile,
		"GRADIENT_PROXY_HETZNER_ENDPOINT": "http://127.0.0.1:9/v1", "GRADIENT_PROXY_HETZNER_PROTO_URL": "wss://proxy.example/proto",
		"GRADIENT_PROXY_HETZNER_BOOT_DEADLINE": "30",
	})
	opts, err := parseOptions([]string{"--hetzner-reconcile-interval", "5"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := defaultHetzner()
	want.Token, want.Endpoint, want.ProtoURL = "hc-token", "http://127.0.0.1:9/v1", "wss://proxy.example/proto"
	want.Interval, want.BootDeadline = 5*time.Second, 30*time.Second
	if !reflect.DeepEqual(opts.Hetzner, want) {
		t.Errorf("got  %+v\nwant %+v", opts.Hetzner, want)
	}
	for name, args := range map[string][]string{
		"token without proto URL": {"--hetzner-token-file", tokenFile},
		"empty token file":        {"--hetzner-token-file", writeFile(t, "empty", "\n"), "--hetzner-proto-url", "ws://p/proto"},
		"window over unit":        {"--hetzner-billing-unit", "60", "--hetzner-scale-down-window", "61"},
		"zero interval":           {"--hetzner-reconcile-interval", "0"},
	} {
		var stderr strings.Builder
		if _, err := parseOptions(append([]string{"--encryption-key-file", "/k"}, args...), envOf(nil), &stderr); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(stderr.String(), "hc-token") {
			t.Errorf("%s: the token is shown: %s", name, stderr.String())
		}
	}
}

// mustAbs is path against the test's working directory: path flags are
// made absolute at start-up.
func mustAbs(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// defaultHTTP are the listener timeouts without flags or variables.
var defaultHTTP = httpguard.Timeouts{Header: httpguard.DefaultHeaderTimeout, Body: httpguard.DefaultBodyTimeout, Idle: httpguard.DefaultIdleTimeout}
