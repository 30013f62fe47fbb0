package main

import (
	"errors"
	"fmt"
	"gradient.dev/gradient/internal/envflag"
	"gradient.dev/gradient/server/scheduler"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

// errUsage marks a configuration error already explained on stderr.
var errUsage = envflag.ErrUsage

// options is the server's configuration after flags and environment.
type options struct {
	Listen           string
	Database         string
	AdminToken       string // plaintext; hashed at start-up and then dropped
	DialKeyFile      string
	NarDir           string // empty: the SQLite data directory, or ./gradient-data
	HeartbeatTimeout time.Duration
	PollInterval     time.Duration // 0: no branch polling
	// AllowLocalRepositories lets projects name file:// URLs and local
	// paths (the API, the branch poll and eval start).
	AllowLocalRepositories bool
	MaxConnections         int
	AuthFailures           int // per minute and client address; 0: no limit
	HandshakesPerIP        int
	// Limits of builds whose derivation sets no timeout / maxSilent; 0
	// disables the limit.
	BuildDefaultTimeoutSecs   uint64
	BuildDefaultMaxSilentSecs uint64
	// Federate offers the reserved federate capability.
	Federate  bool
	LogLevel  slog.Level
	LogFormat string
}

// setting is one flag, the environment variable that sets it when the
// flag is absent, its default and its help.
type setting = envflag.Setting

func newSetting(flag, env, def, usage string) setting {
	return setting{Flag: flag, Env: env, Default: def, Usage: usage}
}

var (
	listenSetting       = newSetting("listen", "GRADIENT_LISTEN", "127.0.0.1:3000", "address to listen on")
	databaseSetting     = newSetting("database", "GRADIENT_DATABASE", "./gradient-data", "a postgres:// URL, or a data directory for embedded SQLite")
	tokenSetting        = newSetting("admin-token", "GRADIENT_ADMIN_TOKEN", "", "admin API token (prefer the file: flags show in ps)")
	tokenFileSetting    = newSetting("admin-token-file", "GRADIENT_ADMIN_TOKEN_FILE", "", "file holding the admin API token")
	dialKeySetting      = newSetting("dial-key-file", "GRADIENT_DIAL_KEY_FILE", "", "32-byte key (raw or base64) sealing the server's secrets at rest: tokens of workers it dials, projects' deploy keys and caches' signing keys; without it, registrations with a URL and deploy keys are refused and signing keys are stored in the clear")
	narDirSetting       = newSetting("nar-dir", "GRADIENT_NAR_DIR", "", "directory of the binary caches' NAR store (NARs go under nars/); default: the SQLite data directory, or ./gradient-data")
	heartbeatSetting    = newSetting("heartbeat-timeout", "GRADIENT_HEARTBEAT_TIMEOUT", "120s", "drop a worker silent this long; 0 disables")
	pollSetting         = newSetting("poll-interval", "GRADIENT_POLL_INTERVAL", "60s", "poll each project's branch this often, starting an evaluation for a new head; 0 disables")
	maxConnSetting      = newSetting("max-connections", "GRADIENT_MAX_CONNECTIONS", "256", "most worker sessions at once")
	allowLocalSetting   = newSetting("allow-local-repositories", "GRADIENT_ALLOW_LOCAL_REPOSITORIES", "false", "let projects use file:// URLs and local paths as repositories (off: a project cannot make the server read repositories on its disk)")
	authFailSetting     = newSetting("auth-failures-per-minute", "GRADIENT_AUTH_FAILURES_PER_MINUTE", "30", "wrong admin tokens and cache API keys one client address may send per minute; beyond them it gets HTTP 429 until it regains attempts at that rate (addresses as the connection shows them: behind a reverse proxy, the proxy's); 0 disables")
	handshakesPerIP     = newSetting("max-handshakes-per-ip", "GRADIENT_MAX_HANDSHAKES_PER_IP", "32", "most worker connections per client IP that have not finished the handshake; raise it for many workers behind one NAT address")
	buildTimeoutSetting = newSetting("build-default-timeout-secs", "GRADIENT_BUILD_DEFAULT_TIMEOUT_SECS", strconv.FormatUint(scheduler.DefaultTimeoutSecs, 10),
		"wall-clock limit in seconds of a build whose derivation sets no timeout; 0 disables")
	buildMaxSilentSetting = newSetting("build-default-max-silent-secs", "GRADIENT_BUILD_DEFAULT_MAX_SILENT_SECS", strconv.FormatUint(scheduler.DefaultMaxSilentSecs, 10),
		"limit in seconds on a build's time without log output when its derivation sets no maxSilent; 0 disables")
	federateSetting  = newSetting("proto-federate", "GRADIENT_PROTO_FEDERATE", "false", "offer the federate capability to workers that offer it too (reserved: negotiated only, no behaviour yet)")
	logLevelSetting  = newSetting("log-level", "GRADIENT_LOG_LEVEL", "info", "debug, info, warn or error")
	logFormatSetting = newSetting("log-format", "GRADIENT_LOG_FORMAT", "text", "text or json")
)

var allSettings = []setting{listenSetting, databaseSetting, tokenSetting, tokenFileSetting,
	dialKeySetting, narDirSetting, heartbeatSetting, pollSetting, allowLocalSetting, maxConnSetting, authFailSetting, handshakesPerIP, buildTimeoutSetting, buildMaxSilentSetting,
	federateSetting, logLevelSetting, logFormatSetting}

const usageIntroduction = `Usage: gradient-server [flags]

Runs the Gradient server: workers connect to /proto, the admin API is under
/api/v1 (use the gradient CLI), metrics are at /metrics, health at /healthz.
Each flag can also be set by its environment variable; a flag wins over the
environment. Without an admin token the admin API answers 503. The admin
token is hashed at start-up; only the hash is kept.

Flags:
`

// parseOptions reads flags, then the environment for every flag not given.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	vals, err := envflag.Parse("gradient-server", args, allSettings, getenv, stderr, printUsage)
	if err != nil {
		return options{}, err
	}
	opts, err := buildOptions(vals, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "gradient-server: %v\n", err)
		return options{}, errUsage
	}
	return opts, nil
}

func buildOptions(vals *envflag.Values, getenv func(string) string) (options, error) {
	value := vals.Get
	opts := options{Listen: value(listenSetting), Database: value(databaseSetting),
		DialKeyFile: value(dialKeySetting), NarDir: value(narDirSetting), LogFormat: value(logFormatSetting)}
	var err error
	if opts.AdminToken, err = adminToken(vals, getenv); err != nil {
		return options{}, err
	}
	if opts.HeartbeatTimeout, err = parseSeconds(value(heartbeatSetting)); err != nil {
		return options{}, fmt.Errorf("--%s: %w", heartbeatSetting.Flag, err)
	}
	if opts.PollInterval, err = parseSeconds(value(pollSetting)); err != nil {
		return options{}, fmt.Errorf("--%s: %w", pollSetting.Flag, err)
	}
	if opts.MaxConnections, err = strconv.Atoi(value(maxConnSetting)); err != nil || opts.MaxConnections < 1 {
		return options{}, fmt.Errorf("--%s %q: want a positive number", maxConnSetting.Flag, value(maxConnSetting))
	}
	if opts.AllowLocalRepositories, err = strconv.ParseBool(value(allowLocalSetting)); err != nil {
		return options{}, fmt.Errorf("--%s %q: want true or false", allowLocalSetting.Flag, value(allowLocalSetting))
	}
	if opts.AuthFailures, err = strconv.Atoi(value(authFailSetting)); err != nil || opts.AuthFailures < 0 {
		return options{}, fmt.Errorf("--%s %q: want a number, 0 to disable", authFailSetting.Flag, value(authFailSetting))
	}
	if opts.HandshakesPerIP, err = strconv.Atoi(value(handshakesPerIP)); err != nil || opts.HandshakesPerIP < 1 {
		return options{}, fmt.Errorf("--%s %q: want a positive number", handshakesPerIP.Flag, value(handshakesPerIP))
	}
	for _, limit := range []struct {
		s   setting
		dst *uint64
	}{{buildTimeoutSetting, &opts.BuildDefaultTimeoutSecs}, {buildMaxSilentSetting, &opts.BuildDefaultMaxSilentSecs}} {
		if *limit.dst, err = strconv.ParseUint(value(limit.s), 10, 63); err != nil {
			return options{}, fmt.Errorf("--%s %q: want seconds, or 0 to disable", limit.s.Flag, value(limit.s))
		}
	}
	if opts.Federate, err = strconv.ParseBool(value(federateSetting)); err != nil {
		return options{}, fmt.Errorf("--%s %q: want true or false", federateSetting.Flag, value(federateSetting))
	}
	if err := opts.LogLevel.UnmarshalText([]byte(value(logLevelSetting))); err != nil {
		return options{}, fmt.Errorf("--%s %q: want debug, info, warn or error", logLevelSetting.Flag, value(logLevelSetting))
	}
	if opts.LogFormat != "text" && opts.LogFormat != "json" {
		return options{}, fmt.Errorf("--%s %q: want text or json", logFormatSetting.Flag, opts.LogFormat)
	}
	if opts.Listen == "" || opts.Database == "" {
		return options{}, errors.New("--listen and --database may not be empty")
	}
	return opts, nil
}

// adminToken picks the token from the flags, else from the environment;
// a token and a token file at the same level are ambiguous.
func adminToken(vals *envflag.Values, getenv func(string) string) (string, error) {
	var token, file string
	switch {
	case vals.Given(tokenSetting) || vals.Given(tokenFileSetting):
		if vals.Given(tokenSetting) && vals.Given(tokenFileSetting) {
			return "", errors.New("give --admin-token or --admin-token-file, not both")
		}
		if vals.Given(tokenSetting) {
			token = vals.Get(tokenSetting)
		} else {
			file = vals.Get(tokenFileSetting)
		}
	default:
		token, file = getenv(tokenSetting.Env), getenv(tokenFileSetting.Env)
		if token != "" && file != "" {
			return "", errors.New("set GRADIENT_ADMIN_TOKEN or GRADIENT_ADMIN_TOKEN_FILE, not both")
		}
	}
	if file == "" {
		return token, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("admin token file: %w", err)
	}
	token = strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("admin token file %s is empty", file)
	}
	return token, nil
}

// parseSeconds reads a Go duration ("90s", "2m") or plain seconds ("120").
func parseSeconds(s string) (time.Duration, error) {
	if n, err := strconv.Atoi(s); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q: want a duration such as 120s, or 0 to disable", s)
	}
	return d, nil
}

func printUsage(w io.Writer) { envflag.PrintUsage(w, usageIntroduction, allSettings) }
