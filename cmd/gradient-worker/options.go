package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
)

// errUsage marks a configuration error already explained on stderr.
var errUsage = errors.New("usage error")

// options is the worker's configuration after flags and environment.
type options struct {
	ServerURL         string
	Peers             string // secrets: never logged
	PeersFile         string
	BaseDir           string
	ID                string
	Zone, Endpoint    string
	Fetch, Eval       bool
	Build             bool
	Architectures     []string
	SystemFeatures    []string
	CPUCoreScore      uint32
	MaxBuilds         int
	MaxEvals          int
	Discoverable      bool
	ListenAddr        string // host:port, set when discoverable
	TLSCertFile       string
	TLSKeyFile        string
	InsecureListen    bool
	AcceptedTokenFile string
	LogLevel          slog.Level
	LogFormat         string
}

// setting is one flag; its environment variable is GRADIENT_WORKER_ plus
// the flag name upper-cased (WORKER.md §2.1).
type setting struct {
	flag, def, usage string
}

func (s setting) env() string {
	return "GRADIENT_WORKER_" + strings.ToUpper(strings.ReplaceAll(s.flag, "-", "_"))
}

var (
	serverURLSetting     = setting{"server-url", "", "ws(s)://host/proto URL of the server to dial (required unless discoverable)"}
	peersSetting         = setting{"peers", "", "inline peers list, peer_id:token lines (prefer the file: flags show in ps)"}
	peersFileSetting     = setting{"peers-file", "", "peers file (peer_id:token lines), watched for changes; wins over --peers"}
	baseDirSetting       = setting{"base-dir", "/var/lib/gradient-worker", "state directory (worker-id)"}
	idSetting            = setting{"id", "", "fixed worker UUID, overriding <base-dir>/worker-id"}
	zoneSetting          = setting{"zone", "", "cluster placement label"}
	endpointSetting      = setting{"endpoint", "", "address listed in cluster rosters"}
	fetchSetting         = setting{"capabilities-fetch", "false", "advertise the fetch capability"}
	evalSetting          = setting{"capabilities-eval", "false", "advertise the eval capability"}
	buildSetting         = setting{"capabilities-build", "false", "advertise the build capability"}
	archSetting          = setting{"system-architectures", "", "comma list of Nix systems built for (default: the host system)"}
	featuresSetting      = setting{"system-features", "", "comma list of Nix system features"}
	cpuScoreSetting      = setting{"system-cpu-core-score", "0", "relative single-core speed; 0 measures it at start"}
	maxBuildsSetting     = setting{"build-max-concurrent", "1", "build job slots"}
	maxEvalsSetting      = setting{"eval-max-concurrent", "1", "flake job slots"}
	discoverableSetting  = setting{"discoverable", "false", "accept server-dialed connections on --listen-addr:--port"}
	listenAddrSetting    = setting{"listen-addr", "127.0.0.1", "address for server-dialed connections"}
	portSetting          = setting{"port", "3100", "port for server-dialed connections"}
	tlsCertSetting       = setting{"tls-cert-file", "", "TLS certificate of the listener"}
	tlsKeySetting        = setting{"tls-key-file", "", "TLS key of the listener"}
	insecureSetting      = setting{"insecure-listen", "false", "serve the listener without TLS (local and test setups only)"}
	acceptedTokenSetting = setting{"accepted-server-tokens-file", "", "peer_id:hash lines a dialing server's tokens must match; without it every server is accepted"}
	logLevelSetting      = setting{"log-level", "info", "debug, info, warn or error"}
	logFormatSetting     = setting{"log-format", "text", "text or json"}
)

var allSettings = []setting{serverURLSetting, peersSetting, peersFileSetting, baseDirSetting, idSetting,
	zoneSetting, endpointSetting, fetchSetting, evalSetting, buildSetting, archSetting, featuresSetting,
	cpuScoreSetting, maxBuildsSetting, maxEvalsSetting, discoverableSetting, listenAddrSetting, portSetting,
	tlsCertSetting, tlsKeySetting, insecureSetting, acceptedTokenSetting, logLevelSetting, logFormatSetting}

const usageIntroduction = `Usage: gradient-worker [flags]

Runs a Gradient worker: it dials the server (or is dialed by it with
--discoverable), authenticates with the tokens of its peers file and runs the
jobs it is assigned. Each flag can also be set by its environment variable;
a flag wins over the environment. SIGTERM or SIGINT drains and stops.

Flags:
`

// parseOptions reads flags, then the environment for every flag not given.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("gradient-worker", flag.ContinueOnError)
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
		fmt.Fprintf(stderr, "gradient-worker: unexpected argument %q\n", fs.Arg(0))
		return options{}, errUsage
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	value := func(s setting) string {
		if given[s.flag] {
			return *raw[s.flag]
		}
		if v := getenv(s.env()); v != "" {
			return v
		}
		return s.def
	}
	opts, err := buildOptions(value)
	if err != nil {
		fmt.Fprintf(stderr, "gradient-worker: %v\n", err)
		return options{}, errUsage
	}
	return opts, nil
}

func buildOptions(value func(setting) string) (options, error) {
	opts := options{
		ServerURL: value(serverURLSetting), Peers: value(peersSetting), PeersFile: value(peersFileSetting),
		BaseDir: value(baseDirSetting), ID: value(idSetting), Zone: value(zoneSetting), Endpoint: value(endpointSetting),
		Architectures: commaList(value(archSetting)), SystemFeatures: commaList(value(featuresSetting)),
		TLSCertFile: value(tlsCertSetting), TLSKeyFile: value(tlsKeySetting),
		AcceptedTokenFile: value(acceptedTokenSetting), LogFormat: value(logFormatSetting),
	}
	var errs []error
	boolean := func(s setting, dst *bool) {
		v, err := strconv.ParseBool(value(s))
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: want true or false", s.flag, value(s)))
		}
		*dst = v
	}
	count := func(s setting, dst *int) {
		v, err := strconv.Atoi(value(s))
		if err != nil || v < 0 {
			errs = append(errs, fmt.Errorf("--%s %q: want a number ≥ 0", s.flag, value(s)))
		}
		*dst = v
	}
	boolean(fetchSetting, &opts.Fetch)
	boolean(evalSetting, &opts.Eval)
	boolean(buildSetting, &opts.Build)
	boolean(discoverableSetting, &opts.Discoverable)
	boolean(insecureSetting, &opts.InsecureListen)
	count(maxBuildsSetting, &opts.MaxBuilds)
	count(maxEvalsSetting, &opts.MaxEvals)
	if opts.MaxBuilds == 0 || opts.MaxEvals == 0 {
		errs = append(errs, errors.New("--build-max-concurrent and --eval-max-concurrent must be at least 1 (disable a kind with its capability)"))
	}
	var score, port int
	count(cpuScoreSetting, &score)
	count(portSetting, &port)
	opts.CPUCoreScore = uint32(score)
	if err := opts.LogLevel.UnmarshalText([]byte(value(logLevelSetting))); err != nil {
		errs = append(errs, fmt.Errorf("--%s %q: want debug, info, warn or error", logLevelSetting.flag, value(logLevelSetting)))
	}
	if opts.LogFormat != "text" && opts.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--%s %q: want text or json", logFormatSetting.flag, opts.LogFormat))
	}
	if opts.BaseDir == "" && opts.ID == "" {
		errs = append(errs, errors.New("--base-dir may not be empty without --id"))
	}
	if opts.Discoverable {
		opts.ListenAddr = net.JoinHostPort(value(listenAddrSetting), strconv.Itoa(port))
		if !opts.InsecureListen && (opts.TLSCertFile == "" || opts.TLSKeyFile == "") {
			errs = append(errs, errors.New("--discoverable needs --tls-cert-file and --tls-key-file (or --insecure-listen)"))
		}
	} else if opts.ServerURL == "" {
		errs = append(errs, errors.New("--server-url is required (unless --discoverable)"))
	}
	if opts.ServerURL != "" && !strings.HasPrefix(opts.ServerURL, "ws://") && !strings.HasPrefix(opts.ServerURL, "wss://") {
		errs = append(errs, fmt.Errorf("--server-url %q: want a ws:// or wss:// URL", opts.ServerURL))
	}
	return opts, errors.Join(errs...)
}

// commaList splits "a, b,,c" into [a b c]; empty gives nil.
func commaList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, usageIntroduction)
	for _, s := range allSettings {
		fmt.Fprintf(w, "  --%s (env %s)\n", s.flag, s.env())
		line := "        " + s.usage
		if d := s.def; d != "" {
			line += " (default " + d + ")"
		}
		fmt.Fprintln(w, line)
	}
}
