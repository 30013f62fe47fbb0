package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

// errUsage marks a configuration error already explained on stderr.
var errUsage = errors.New("usage error")

// options is the server's configuration after flags and environment.
type options struct {
	Listen           string
	Database         string
	AdminToken       string // plaintext; hashed at start-up and then dropped
	DialKeyFile      string
	NarDir           string // empty: the SQLite data directory, or ./gradient-data
	HeartbeatTimeout time.Duration
	MaxConnections   int
	LogLevel         slog.Level
	LogFormat        string
}

// setting is one flag, the environment variable that sets it when the
// flag is absent, and its default.
type setting struct {
	flag, env, def, usage string
}

var (
	listenSetting    = setting{"listen", "GRADIENT_LISTEN", "127.0.0.1:3000", "address to listen on"}
	databaseSetting  = setting{"database", "GRADIENT_DATABASE", "./gradient-data", "a postgres:// URL, or a data directory for embedded SQLite"}
	tokenSetting     = setting{"admin-token", "GRADIENT_ADMIN_TOKEN", "", "admin API token (prefer the file: flags show in ps)"}
	tokenFileSetting = setting{"admin-token-file", "GRADIENT_ADMIN_TOKEN_FILE", "", "file holding the admin API token"}
	dialKeySetting   = setting{"dial-key-file", "GRADIENT_DIAL_KEY_FILE", "", "32-byte key (raw or base64) sealing the tokens of workers the server dials; without it, registrations with a URL are refused"}
	narDirSetting    = setting{"nar-dir", "GRADIENT_NAR_DIR", "", "directory of the binary caches' NAR store (NARs go under nars/); default: the SQLite data directory, or ./gradient-data"}
	heartbeatSetting = setting{"heartbeat-timeout", "GRADIENT_HEARTBEAT_TIMEOUT", "120s", "drop a worker silent this long; 0 disables"}
	maxConnSetting   = setting{"max-connections", "GRADIENT_MAX_CONNECTIONS", "256", "most worker sessions at once"}
	logLevelSetting  = setting{"log-level", "GRADIENT_LOG_LEVEL", "info", "debug, info, warn or error"}
	logFormatSetting = setting{"log-format", "GRADIENT_LOG_FORMAT", "text", "text or json"}
)

var allSettings = []setting{listenSetting, databaseSetting, tokenSetting, tokenFileSetting,
	dialKeySetting, narDirSetting, heartbeatSetting, maxConnSetting, logLevelSetting, logFormatSetting}

const usageIntroduction = `Usage: gradient-server [flags]

Runs the Gradient server: workers connect to /proto, the admin API is under
/api/v1 (use the gradient CLI), metrics are at /metrics, health at /healthz.
Each flag can also be set by its environment variable; a flag wins over the
environment. Without an admin token the admin API answers 503. The admin
token is hashed at start-up; only the hash is kept.

Flags:
`

// parseOptions reads flags, then the environment for every flag not given.
// Values are strings first so flag and environment share one parser.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("gradient-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	raw := map[string]*string{}
	for _, s := range allSettings {
		raw[s.flag] = fs.String(s.flag, "", "")
	}
	fs.Usage = func() { printUsage(stderr) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return options{}, err
		}
		return options{}, errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gradient-server: unexpected argument %q\n", fs.Arg(0))
		return options{}, errUsage
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	value := func(s setting) string {
		if given[s.flag] {
			return *raw[s.flag]
		}
		if v := getenv(s.env); v != "" {
			return v
		}
		return s.def
	}
	opts, err := buildOptions(value, given, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "gradient-server: %v\n", err)
		return options{}, errUsage
	}
	return opts, nil
}

func buildOptions(value func(setting) string, given map[string]bool, getenv func(string) string) (options, error) {
	opts := options{Listen: value(listenSetting), Database: value(databaseSetting),
		DialKeyFile: value(dialKeySetting), NarDir: value(narDirSetting), LogFormat: value(logFormatSetting)}
	var err error
	if opts.AdminToken, err = adminToken(given, value, getenv); err != nil {
		return options{}, err
	}
	if opts.HeartbeatTimeout, err = parseSeconds(value(heartbeatSetting)); err != nil {
		return options{}, fmt.Errorf("--%s: %w", heartbeatSetting.flag, err)
	}
	if opts.MaxConnections, err = strconv.Atoi(value(maxConnSetting)); err != nil || opts.MaxConnections < 1 {
		return options{}, fmt.Errorf("--%s %q: want a positive number", maxConnSetting.flag, value(maxConnSetting))
	}
	if err := opts.LogLevel.UnmarshalText([]byte(value(logLevelSetting))); err != nil {
		return options{}, fmt.Errorf("--%s %q: want debug, info, warn or error", logLevelSetting.flag, value(logLevelSetting))
	}
	if opts.LogFormat != "text" && opts.LogFormat != "json" {
		return options{}, fmt.Errorf("--%s %q: want text or json", logFormatSetting.flag, opts.LogFormat)
	}
	if opts.Listen == "" || opts.Database == "" {
		return options{}, errors.New("--listen and --database may not be empty")
	}
	return opts, nil
}

// adminToken picks the token from the flags, else from the environment;
// a token and a token file at the same level are ambiguous.
func adminToken(given map[string]bool, value func(setting) string, getenv func(string) string) (string, error) {
	var token, file string
	switch {
	case given[tokenSetting.flag] || given[tokenFileSetting.flag]:
		if given[tokenSetting.flag] && given[tokenFileSetting.flag] {
			return "", errors.New("give --admin-token or --admin-token-file, not both")
		}
		if given[tokenSetting.flag] {
			token = value(tokenSetting)
		} else {
			file = value(tokenFileSetting)
		}
	default:
		token, file = getenv(tokenSetting.env), getenv(tokenFileSetting.env)
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

func printUsage(w io.Writer) {
	fmt.Fprint(w, usageIntroduction)
	for _, s := range allSettings {
		fmt.Fprintf(w, "  --%s (env %s)\n", s.flag, s.env)
		line := "        " + s.usage
		if d := s.def; d != "" {
			line += " (default " + d + ")"
		}
		fmt.Fprintln(w, line)
	}
}
