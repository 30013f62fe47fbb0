package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v3"

	"gradient.dev/gradient/internal/clitest"
	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/internal/servicecli"
	"gradient.dev/gradient/narstore/s3store"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaults(t *testing.T) {
	opts, err := parseOptions(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{HTTP: defaultHTTP, Listen: "127.0.0.1:3000", Database: mustAbs(t, "gradient-data"), HeartbeatTimeout: 120 * time.Second,
		PollInterval: time.Minute, GCInterval: 24 * time.Hour, GCGrace: 6 * time.Hour, KeepEvaluations: 30, MaxConnections: 256, BuildDefaultTimeoutSecs: 14400, BuildDefaultMaxSilentSecs: 3600, BuildMaxAttempts: 3, BuildRetryBackoff: 30 * time.Second,
		AuthFailures: 30, HandshakesPerIP: 32, AnonymousCache: true, AnonymousCachePerIP: 32, Discoverable: true, LogLevel: slog.LevelInfo, LogFormat: "text",
		NarStore: "local", S3: s3store.Config{Region: "us-east-1"}, NarHTTP: "redirect", NarPresignUploads: true, MultipartThreshold: 1 << 30,
		InstanceLease: 30 * time.Second, InstanceRenew: 5 * time.Second}
	if opts != want {
		t.Errorf("got %+v, want %+v", opts, want)
	}
}

// withNarDefaults sets the NAR store and instance options to their
// defaults.
func withNarDefaults(o options) options {
	o.NarStore, o.S3, o.NarHTTP, o.NarPresignUploads, o.MultipartThreshold = "local", s3store.Config{Region: "us-east-1"}, "redirect", true, 1<<30
	o.InstanceLease, o.InstanceRenew = 30*time.Second, 5*time.Second
	return o
}

func TestFlagWinsOverEnvironment(t *testing.T) {
	env := envOf(map[string]string{
		"GRADIENT_LISTEN": "0.0.0.0:4000", "GRADIENT_DATABASE": "postgres://db/gradient",
		"GRADIENT_HEARTBEAT_TIMEOUT": "30", "GRADIENT_MAX_CONNECTIONS": "10",
		"GRADIENT_LOG_LEVEL": "debug", "GRADIENT_LOG_FORMAT": "json", "GRADIENT_ADMIN_TOKEN": "from-env",
		"GRADIENT_POLL_INTERVAL": "5m", "GRADIENT_BUILD_DEFAULT_TIMEOUT_SECS": "0", "GRADIENT_BUILD_DEFAULT_MAX_SILENT_SECS": "600",
		"GRADIENT_PROTO_FEDERATE": "true", "GRADIENT_AUTH_FAILURES_PER_MINUTE": "5", "GRADIENT_ALLOW_LOCAL_REPOSITORIES": "true",
		"GRADIENT_GC_INTERVAL": "3600", "GRADIENT_GC_GRACE": "0", "GRADIENT_KEEP_EVALUATIONS": "2",
		"GRADIENT_INSTANCE_ID": "eu-1",
	})
	opts, err := parseOptions(nil, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{HTTP: defaultHTTP, Listen: "0.0.0.0:4000", Database: "postgres://db/gradient", AdminToken: "from-env",
		HeartbeatTimeout: 30 * time.Second, PollInterval: 5 * time.Minute, GCInterval: time.Hour, KeepEvaluations: 2, AllowLocalRepositories: true, MaxConnections: 10,
		BuildDefaultTimeoutSecs: 0, BuildDefaultMaxSilentSecs: 600, BuildMaxAttempts: 3, BuildRetryBackoff: 30 * time.Second, Federate: true, AuthFailures: 5, HandshakesPerIP: 32,
		AnonymousCache: true, AnonymousCachePerIP: 32, Discoverable: true, LogLevel: slog.LevelDebug, LogFormat: "json"}
	want = withNarDefaults(want)
	want.InstanceID = "eu-1"
	if opts != want {
		t.Errorf("environment: got %+v, want %+v", opts, want)
	}
	opts, err = parseOptions([]string{"--listen", "127.0.0.1:5000", "--database=/data", "--heartbeat-timeout", "0",
		"--max-connections", "3", "--log-level", "warn", "--log-format", "text", "--admin-token", "from-flag", "--poll-interval", "0",
		"--build-default-timeout-secs", "60", "--build-default-max-silent-secs=0", "--proto-federate=false",
		"--auth-failures-per-minute", "0", "--allow-local-repositories=false", "--keep-evaluations", "5", "--gc-interval", "0",
		"--instance-id", "us-2", "--instance-lease", "60", "--instance-renew", "10s", "--accept-config-change"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want = options{HTTP: defaultHTTP, Listen: "127.0.0.1:5000", Database: "/data", AdminToken: "from-flag",
		HeartbeatTimeout: 0, KeepEvaluations: 5, MaxConnections: 3, BuildDefaultTimeoutSecs: 60, BuildDefaultMaxSilentSecs: 0, BuildMaxAttempts: 3, BuildRetryBackoff: 30 * time.Second, HandshakesPerIP: 32,
		AnonymousCache: true, AnonymousCachePerIP: 32, Discoverable: true, LogLevel: slog.LevelWarn, LogFormat: "text"}
	want = withNarDefaults(want)
	want.InstanceID, want.InstanceLease, want.InstanceRenew, want.AcceptConfigChange = "us-2", time.Minute, 10*time.Second, true
	if opts != want {
		t.Errorf("flags: got %+v, want %+v", opts, want)
	}
	for _, bad := range []string{"has space", "a/b", strings.Repeat("x", 65)} {
		if _, err := parseOptions([]string{"--instance-id", bad}, envOf(nil), io.Discard); err == nil {
			t.Errorf("--instance-id %q accepted", bad)
		}
	}
}

func TestAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(file, []byte("  secret-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := parseOptions([]string{"--admin-token-file", file}, envOf(nil), io.Discard)
	if err != nil || opts.AdminToken != "secret-from-file" {
		t.Fatalf("flag: %q, %v", opts.AdminToken, err)
	}
	opts, err = parseOptions(nil, envOf(map[string]string{"GRADIENT_ADMIN_TOKEN_FILE": file}), io.Discard)
	if err != nil || opts.AdminToken != "secret-from-file" {
		t.Fatalf("env: %q, %v", opts.AdminToken, err)
	}
	// A flag overrides both environment forms.
	opts, err = parseOptions([]string{"--admin-token", "flag"}, envOf(map[string]string{"GRADIENT_ADMIN_TOKEN_FILE": file}), io.Discard)
	if err != nil || opts.AdminToken != "flag" {
		t.Fatalf("flag over env file: %q, %v", opts.AdminToken, err)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--admin-token-file", empty}, nil, "is empty"},
		{[]string{"--admin-token-file", filepath.Join(dir, "missing")}, nil, "admin token file"},
		{[]string{"--admin-token", "a", "--admin-token-file", file}, nil, "not both"},
		{nil, map[string]string{"GRADIENT_ADMIN_TOKEN": "a", "GRADIENT_ADMIN_TOKEN_FILE": file}, "not both"},
	} {
		var stderr bytes.Buffer
		_, err := parseOptions(c.args, envOf(c.env), &stderr)
		if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v %v: %v, stderr %q", c.args, c.env, err, stderr.String())
		}
	}
}

func TestBadOptions(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--heartbeat-timeout", "soon"}, nil, "heartbeat-timeout"},
		{nil, map[string]string{"GRADIENT_HEARTBEAT_TIMEOUT": "-5s"}, "heartbeat-timeout"},
		{[]string{"--max-connections", "0"}, nil, "max-connections"},
		{[]string{"--auth-failures-per-minute", "-1"}, nil, "auth-failures-per-minute"},
		{nil, map[string]string{"GRADIENT_LOG_LEVEL": "loud"}, "log-level"},
		{[]string{"--log-format", "xml"}, nil, "log-format"},
		{[]string{"--build-default-timeout-secs", "-1"}, nil, "build-default-timeout-secs"},
		{nil, map[string]string{"GRADIENT_BUILD_DEFAULT_MAX_SILENT_SECS": "1h"}, "build-default-max-silent-secs"},
		{[]string{"--proto-federate=maybe"}, nil, "proto-federate"},
		{nil, map[string]string{"GRADIENT_PROTO_MAX_CONNECTIONS": "many"}, "GRADIENT_PROTO_MAX_CONNECTIONS"},
		{[]string{"--proto-anonymous-cache-max-connections-per-ip", "0"}, nil, "proto-anonymous-cache-max-connections-per-ip"},
		{[]string{"--proto-federate", "true"}, nil, "--proto-federate=true"},
		{[]string{"--no-such-flag"}, nil, "not defined"},
		{[]string{"extra"}, nil, "unexpected argument"},
	} {
		var stderr bytes.Buffer
		_, err := parseOptions(c.args, envOf(c.env), &stderr)
		if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v %v: %v, stderr %q", c.args, c.env, err, stderr.String())
		}
	}
}

// A configured 0 reaches the job loop as "no limit", not as "unset" (which
// would bring back the 14400 / 3600 defaults).
func TestBuildLimitsReachTheJobLoop(t *testing.T) {
	opts, err := parseOptions([]string{"--build-default-timeout-secs", "0", "--build-default-max-silent-secs", "90"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg := jobLoopConfig(opts, slog.New(slog.DiscardHandler), nil)
	if cfg.DefaultTimeoutSecs == nil || *cfg.DefaultTimeoutSecs != 0 || cfg.DefaultMaxSilentSecs == nil || *cfg.DefaultMaxSilentSecs != 90 {
		t.Errorf("job loop limits %v / %v, want 0 and 90", cfg.DefaultTimeoutSecs, cfg.DefaultMaxSilentSecs)
	}
}

// The reference's retry settings reach the job loop; a backoff of 0
// retries at once (the scheduler's zero would be its 30 s default).
func TestBuildRetriesReachTheJobLoop(t *testing.T) {
	opts, err := parseOptions(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := jobLoopConfig(opts, slog.New(slog.DiscardHandler), nil); cfg.MaxAttempts != 3 || cfg.RetryBackoff != 30*time.Second {
		t.Errorf("defaults: %d attempts, backoff %v; want 3 and 30s", cfg.MaxAttempts, cfg.RetryBackoff)
	}
	opts, err = parseOptions(nil, envOf(map[string]string{"GRADIENT_BUILD_MAX_ATTEMPTS": "5", "GRADIENT_BUILD_RETRY_BACKOFF_SECS": "0"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := jobLoopConfig(opts, slog.New(slog.DiscardHandler), nil); cfg.MaxAttempts != 5 || cfg.RetryBackoff >= 0 {
		t.Errorf("from the reference's variables: %d attempts, backoff %v; want 5 and at once", cfg.MaxAttempts, cfg.RetryBackoff)
	}
	if _, err := parseOptions([]string{"--build-max-attempts", "0"}, envOf(nil), io.Discard); err == nil {
		t.Error("--build-max-attempts 0 accepted")
	}
}

func TestHelpNamesEveryEnvironmentVariable(t *testing.T) {
	var stderr bytes.Buffer
	_, err := parseOptions([]string{"-h"}, envOf(map[string]string{"GRADIENT_ADMIN_TOKEN": "do-not-print"}), &stderr)
	if !errors.Is(err, servicecli.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	clitest.HelpListsEveryVariable(t, serverCommand(), stderr.String())
	if strings.Contains(stderr.String(), "do-not-print") {
		t.Error("help shows the admin token from the environment")
	}
}

// Every flag can be set by a variable (the NixOS modules set nothing else).
func TestEveryFlagHasAVariable(t *testing.T) {
	clitest.EveryFlagHasAVariable(t, serverCommand())
}

// The reference's variable names set the options they name there; where
// ours exists too, ours is listed first and wins.
func TestReferenceVariableNames(t *testing.T) {
	opts, err := parseOptions(nil, envOf(map[string]string{
		"GRADIENT_PROTO_WORKER_HEARTBEAT_TIMEOUT_SECS": "7", "GRADIENT_PROTO_MAX_CONNECTIONS": "9",
		"GRADIENT_PROTO_FEDERATE": "true", "GRADIENT_PROTO_ANONYMOUS_CACHE_ENABLE": "false",
		"GRADIENT_PROTO_ANONYMOUS_CACHE_MAX_CONNECTIONS_PER_IP": "4",
		"GRADIENT_BUILD_DEFAULT_TIMEOUT_SECS":                   "600", "GRADIENT_BUILD_DEFAULT_MAX_SILENT_SECS": "60",
		"GRADIENT_PROTO_DISCOVERABLE": "false",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if opts.HeartbeatTimeout != 7*time.Second || opts.MaxConnections != 9 || !opts.Federate || opts.AnonymousCache || opts.Discoverable ||
		opts.AnonymousCachePerIP != 4 || opts.BuildDefaultTimeoutSecs != 600 || opts.BuildDefaultMaxSilentSecs != 60 {
		t.Errorf("reference names: %+v", opts)
	}
	opts, err = parseOptions(nil, envOf(map[string]string{
		"GRADIENT_HEARTBEAT_TIMEOUT": "30s", "GRADIENT_PROTO_WORKER_HEARTBEAT_TIMEOUT_SECS": "7",
		"GRADIENT_MAX_CONNECTIONS": "5", "GRADIENT_PROTO_MAX_CONNECTIONS": "9",
	}), io.Discard)
	if err != nil || opts.HeartbeatTimeout != 30*time.Second || opts.MaxConnections != 5 {
		t.Errorf("both names set: %+v, %v; want ours (30s, 5)", opts, err)
	}
	// The reference's options are flags too.
	opts, err = parseOptions([]string{"--proto-anonymous-cache-enable=false", "--proto-anonymous-cache-max-connections-per-ip", "3",
		"--proto-max-connections", "2", "--proto-federate", "--proto-discoverable=false"}, envOf(map[string]string{"GRADIENT_PROTO_DISCOVERABLE": "true"}), io.Discard)
	if err != nil || opts.AnonymousCache || opts.AnonymousCachePerIP != 3 || opts.MaxConnections != 2 || !opts.Federate || opts.Discoverable {
		t.Errorf("reference flags: %+v, %v", opts, err)
	}
}

// serverCommand is the server's command tree as the binary builds it.
func serverCommand() *cli.Command {
	cmd, _ := command(&options{}, servicecli.NewEnv(envOf(nil)), &servicecli.Logging{})
	return cmd
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

// The S3 store from its URL form or its flags, credentials from a file or
// the AWS variables; a missing bucket or missing credentials is refused.
func TestS3StoreOptions(t *testing.T) {
	opts, err := parseOptions([]string{"--nar-store", "s3://nars/ci?endpoint=http://10.0.0.5:7070&path-style=true&region=eu-1"},
		envOf(map[string]string{"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := s3store.Config{Endpoint: "http://10.0.0.5:7070", Bucket: "nars", Prefix: "ci", Region: "eu-1", PathStyle: true, AccessKey: "AK", SecretKey: "SK"}
	if opts.S3 != want {
		t.Fatalf("URL form: %+v, want %+v", opts.S3, want)
	}
	creds := filepath.Join(t.TempDir(), "credentials")
	os.WriteFile(creds, []byte("[other]\naws_access_key_id = no\n[default]\naws_access_key_id = FK\naws_secret_access_key = FS\n"), 0o600)
	opts, err = parseOptions(nil, envOf(map[string]string{"GRADIENT_NAR_STORE": "s3", "GRADIENT_S3_BUCKET": "b", "GRADIENT_S3_CREDENTIALS_FILE": creds,
		"GRADIENT_NAR_HTTP": "stream", "GRADIENT_NAR_MULTIPART_THRESHOLD": "1000", "GRADIENT_NAR_PRESIGNED_PULL_MIN_BYTES": "4096", "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if opts.S3.Bucket != "b" || opts.S3.AccessKey != "FK" || opts.S3.SecretKey != "FS" || opts.NarHTTP != "stream" || opts.MultipartThreshold != 1000 ||
		opts.PresignedPullMinBytes != 4096 {
		t.Fatalf("flags: %+v", opts)
	}
	for _, bad := range [][]string{
		{"--nar-store", "s3"},                     // no bucket
		{"--nar-store", "s3", "--s3-bucket", "b"}, // no credentials
		{"--nar-store", "s3://user:pw@b"},         // credentials in the URL
		{"--nar-store", "ftp://x"},                // unknown store
		{"--nar-http", "proxy"},                   // unknown mode
		{"--nar-presigned-pull-min-bytes", "-1"},  // negative size
	} {
		if _, err := parseOptions(bad, envOf(nil), io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Presigned URLs naming a loopback address only work for workers on the
// server's host: the operator is told.
func TestS3LocalOnlyWarning(t *testing.T) {
	for ep, local := range map[string]bool{"http://127.0.0.1:7070": true, "http://localhost:9000": true, "http://[::1]:1": true,
		"http://169.254.1.1": true, "https://s3.example.com": false, "http://10.0.0.5:7070": false} {
		if got := (s3store.Config{Endpoint: ep}).LocalOnlyWarning() != ""; got != local {
			t.Errorf("%s: warning %v, want %v", ep, got, local)
		}
	}
	if (s3store.Config{Endpoint: "http://127.0.0.1:7070", PresignEndpoint: "https://s3.example.com"}).LocalOnlyWarning() != "" {
		t.Error("a reachable presign endpoint still warns")
	}
}
