package main

import (
	"errors"
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
	"gradient.dev/gradient/nix/narsig"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/workersession"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaults(t *testing.T) {
	opts, err := parseOptions([]string{"--server-url", "wss://ci.example/proto"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{HTTP: defaultHTTP, ServerURL: "wss://ci.example/proto", BaseDir: "/var/lib/gradient-worker", SSHBin: "ssh", GCRootsDir: "/nix/var/nix/gcroots/gradient", LogBurstPerMin: 8 << 20, LogSustainedPerHour: 64 << 20, MaxBuilds: 32, MaxEvals: 1,
		DrainTimeout: 60 * time.Second, Fetch: true, Eval: true, Build: true, RequireSigs: true, LogLevel: slog.LevelInfo, LogFormat: "text",
		GCCheckInterval: time.Minute, EvalBuildNice: 10}
	if !reflect.DeepEqual(opts, want) {
		t.Errorf("got %+v, want %+v", opts, want)
	}
}

func TestEnvironmentAndFlags(t *testing.T) {
	env := envOf(map[string]string{
		"GRADIENT_WORKER_SERVER_URL": "ws://env/proto", "GRADIENT_WORKER_BASE_DIR": "/env",
		"GRADIENT_WORKER_CAPABILITIES_BUILD": "false", "GRADIENT_WORKER_CAPABILITIES_FEDERATE": "true", "GRADIENT_WORKER_SYSTEM_ARCHITECTURES": "x86_64-linux, aarch64-linux",
		"GRADIENT_WORKER_SYSTEM_FEATURES": "kvm,big-parallel", "GRADIENT_WORKER_BUILD_MAX_CONCURRENT": "4",
		"GRADIENT_WORKER_DISCOVERABLE": "true", "GRADIENT_WORKER_PORT": "4000", "GRADIENT_WORKER_INSECURE_LISTEN": "1",
		"GRADIENT_WORKER_LOG_FORMAT": "json", "GRADIENT_WORKER_ALLOW_LOCAL_REPOSITORIES": "true",
		"GRADIENT_WORKER_DRAIN_TIMEOUT_SECS":  "600",
		"GRADIENT_WORKER_TRUSTED_PUBLIC_KEYS": testKeys, "GRADIENT_WORKER_REQUIRE_SIGS": "false",
		"GRADIENT_WORKER_GC_MIN_FREE": "5G", "GRADIENT_WORKER_GC_MAX_FREE": "1T",
	})
	opts, err := parseOptions([]string{"--base-dir", "/flag", "--capabilities-fetch=false", "--log-level", "debug", "--gc-max-free", "20GiB"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{HTTP: defaultHTTP, ServerURL: "ws://env/proto", BaseDir: "/flag", SSHBin: "ssh", GCRootsDir: "/nix/var/nix/gcroots/gradient", LogBurstPerMin: 8 << 20, LogSustainedPerHour: 64 << 20, Eval: true, Federate: true,
		Architectures: []string{"x86_64-linux", "aarch64-linux"}, SystemFeatures: []string{"kvm", "big-parallel"},
		MaxBuilds: 4, MaxEvals: 1, DrainTimeout: 600 * time.Second, Discoverable: true, ListenAddr: "127.0.0.1:4000", InsecureListen: true,
		AllowLocalRepositories: true, LogLevel: slog.LevelDebug, LogFormat: "json",
		GCMinFree: 5 << 30, GCMaxFree: 20 << 30, GCCheckInterval: time.Minute, EvalBuildNice: 10}
	want.TrustedKeys, _ = narsig.ParseKeys(testKeys)
	if !reflect.DeepEqual(opts, want) {
		t.Errorf("got %+v\nwant %+v", opts, want)
	}
	// 0 is the immediate stop; the flag wins over the variable.
	if opts, err := parseOptions([]string{"--drain-timeout-secs", "0"}, env, io.Discard); err != nil || opts.DrainTimeout != 0 {
		t.Errorf("--drain-timeout-secs 0: %v, %v", opts.DrainTimeout, err)
	}
}

// testKeys are two binary-cache public keys as `gradient cache create`
// prints them, as an operator would list them.
const testKeys = "ci.example-main:dGVzdCBrZXkgb2YgMzIgYnl0ZXMsIG5vdCBzZWNyZXQ=, cache.nixos.org-1:6NCHdD59X431o0gWypbMrAURkbJ16ZPMQFGspcDShjY="

func TestInvalidOptions(t *testing.T) {
	for _, args := range [][]string{
		{},                                 // no server URL
		{"--server-url", "http://x/proto"}, // not a WebSocket URL
		{"--server-url", "ws://x/proto", "--capabilities-build", "maybe"},
		{"--server-url", "ws://x/proto", "--gc-min-free", "5X"},
		{"--server-url", "ws://x/proto", "--gc-max-free", "-1"},
		{"--server-url", "ws://x/proto", "--gc-min-free", "99999999999T"},
		{"--server-url", "ws://x/proto", "--build-max-concurrent", "0"},
		{"--server-url", "ws://x/proto", "--drain-timeout-secs", "-5"},
		{"--server-url", "ws://x/proto", "--drain-timeout-secs", "soon"},
		{"--discoverable"}, // no TLS and no --insecure-listen
		{"--server-url", "ws://x/proto", "--port", "70000"},
		{"--discoverable", "true", "--insecure-listen"}, // a boolean flag takes no separate value
		{"--server-url", "ws://x/proto", "--trusted-public-keys", "main:not-a-key"},
		{"--server-url", "ws://x/proto", "--trusted-public-keys", "cache.nixos.org-1"},
	} {
		var stderr strings.Builder
		if _, err := parseOptions(args, envOf(nil), &stderr); err != errUsage || stderr.Len() == 0 {
			t.Errorf("%q: got %v, stderr %q", args, err, stderr.String())
		}
	}
}

func TestWorkerConfigCreatesIdentity(t *testing.T) {
	dir := t.TempDir()
	opts, err := parseOptions([]string{"--server-url", "ws://x/proto", "--base-dir", dir}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := workerConfig(opts, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, worker.IDFileName))
	if err != nil || strings.TrimSpace(string(b)) != cfg.Session.WorkerID || cfg.Session.ServerTokens != nil {
		t.Fatalf("id file %q (%v), config id %q", b, err, cfg.Session.WorkerID)
	}
	if err := os.WriteFile(filepath.Join(dir, worker.IDFileName), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := workerConfig(opts, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("an invalid worker-id file must stop the start")
	}
}

// A boolean flag alone means true, as in every other tool (issue 15:
// "--discoverable --insecure-listen" failed with "want true or false").
func TestBareBooleanFlags(t *testing.T) {
	opts, err := parseOptions([]string{"--discoverable", "--insecure-listen", "--port", "4100", "--capabilities-eval=false"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !opts.Discoverable || !opts.InsecureListen || opts.ListenAddr != "127.0.0.1:4100" || opts.Eval || !opts.Build {
		t.Errorf("got %+v", opts)
	}
	var stderr strings.Builder
	if _, err := parseOptions([]string{"--discoverable", "true", "--insecure-listen"}, envOf(nil), &stderr); err != errUsage ||
		!strings.Contains(stderr.String(), "--discoverable takes no separate value") {
		t.Errorf("--discoverable true: %v, stderr %q", err, stderr.String())
	}
}

func TestEveryFlagHasAVariable(t *testing.T) {
	clitest.EveryFlagHasAVariable(t, workerCommand())
}

func TestHelpNamesEveryEnvironmentVariable(t *testing.T) {
	var stderr strings.Builder
	if _, err := parseOptions([]string{"--help"}, envOf(map[string]string{"GRADIENT_WORKER_PEERS": "p:do-not-print"}), &stderr); !errors.Is(err, servicecli.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	clitest.HelpListsEveryVariable(t, workerCommand(), stderr.String())
	if strings.Contains(stderr.String(), "do-not-print") {
		t.Error("help shows the inline peers from the environment")
	}
}

// The reference's NixOS module sets these names; each reaches its option.
func TestReferenceVariableNames(t *testing.T) {
	peers := filepath.Join(t.TempDir(), "peers")
	tokens := filepath.Join(t.TempDir(), "tokens")
	opts, err := parseOptions(nil, envOf(map[string]string{
		"GRADIENT_WORKER_CAPABILITIES_FETCH": "false", "GRADIENT_WORKER_CAPABILITIES_EVAL": "false",
		"GRADIENT_WORKER_CAPABILITIES_BUILD": "true", "GRADIENT_WORKER_CAPABILITIES_FEDERATE": "true",
		"GRADIENT_WORKER_PEERS_FILE": peers, "GRADIENT_WORKER_ACCEPTED_SERVER_TOKENS_FILE": tokens,
		"GRADIENT_WORKER_DISCOVERABLE": "true", "GRADIENT_WORKER_PORT": "3999", "GRADIENT_WORKER_LISTEN_ADDR": "0.0.0.0",
		"GRADIENT_WORKER_INSECURE_LISTEN":      "true",
		"GRADIENT_WORKER_BUILD_MAX_CONCURRENT": "32", "GRADIENT_WORKER_EVAL_MAX_CONCURRENT": "3",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Fetch || opts.Eval || !opts.Build || !opts.Federate || opts.PeersFile != peers || opts.AcceptedTokenFile != tokens ||
		!opts.Discoverable || opts.ListenAddr != "0.0.0.0:3999" || opts.MaxBuilds != 32 || opts.MaxEvals != 3 {
		t.Errorf("got %+v", opts)
	}
}

// workerCommand is the worker's command tree as the binary builds it.
func workerCommand() *cli.Command {
	return command(&options{}, &rawOptions{}, servicecli.NewEnv(envOf(nil)), &servicecli.Logging{})
}

// The start-up line shows where secrets come from, never the secrets: the
// server URL's password and the inline peers' tokens stay out.
func TestStartupLineHidesSecrets(t *testing.T) {
	token := strings.Repeat("9", handshake.PeerTokenLength)
	opts, err := parseOptions([]string{"--server-url", "wss://ci:url-password@ci.example/proto", "--peers", "team:" + token,
		"--discoverable", "--insecure-listen", "--port", "4200"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	logStart(slog.New(slog.NewTextHandler(&logs, nil)), opts, worker.Config{Session: workersession.Config{WorkerID: "w-1"}})
	line := logs.String()
	for _, secret := range []string{"url-password", token} {
		if strings.Contains(line, secret) {
			t.Errorf("start-up line shows %q: %s", secret, line)
		}
	}
	for _, want := range []string{"gradient-worker starting", "server_url=wss://ci:xxxxx@ci.example/proto", "worker_id=w-1",
		"inline_peers=true", "listen=127.0.0.1:4200", "tls=false", "capabilities.build=true"} {
		if !strings.Contains(line, want) {
			t.Errorf("start-up line lacks %q: %s", want, line)
		}
	}
}

// defaultHTTP are the listener timeouts without flags or variables.
var defaultHTTP = httpguard.Timeouts{Header: httpguard.DefaultHeaderTimeout, Body: httpguard.DefaultBodyTimeout, Idle: httpguard.DefaultIdleTimeout}
