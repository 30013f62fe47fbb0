package main

import (
	"errors"
	"fmt"
	"gradient.dev/gradient/internal/envflag"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
)

// errUsage marks a configuration error already explained on stderr.
var errUsage = envflag.ErrUsage

// options is the worker's configuration after flags and environment.
type options struct {
	ServerURL  string
	Peers      string // secrets: never logged
	PeersFile  string
	BaseDir    string
	NixBin     string
	SSHBin     string
	GCRootsDir string
	// MetricsAddr serves /metrics when set.
	MetricsAddr string
	// Build log limits; 0 is unlimited.
	LogBurstPerMin, LogSustainedPerHour int64
	BuildCores                          int
	ID                                  string
	Zone, Endpoint                      string
	Fetch, Eval                         bool
	Build                               bool
	Federate                            bool
	Architectures                       []string
	SystemFeatures                      []string
	CPUCoreScore                        uint32
	MaxBuilds                           int
	MaxEvals                            int
	Discoverable                        bool
	ListenAddr                          string // host:port, set when discoverable
	TLSCertFile                         string
	TLSKeyFile                          string
	InsecureListen                      bool
	AcceptedTokenFile                   string
	AllowLocalRepositories              bool
	LogLevel                            slog.Level
	LogFormat                           string
}

// setting is one flag; its environment variable is GRADIENT_WORKER_ plus
// the flag name upper-cased (WORKER.md §2.1).
type setting = envflag.Setting

func workerSetting(flag, def, usage string) setting {
	return setting{Flag: flag, Env: "GRADIENT_WORKER_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_")), Default: def, Usage: usage}
}

var (
	serverURLSetting     = workerSetting("server-url", "", "ws(s)://host/proto URL of the server to dial (required unless discoverable)")
	peersSetting         = workerSetting("peers", "", "inline peers list, peer_id:token lines (prefer the file: flags show in ps)")
	peersFileSetting     = workerSetting("peers-file", "", "peers file (peer_id:token lines), watched for changes; wins over --peers")
	baseDirSetting       = workerSetting("base-dir", "/var/lib/gradient-worker", "state directory (worker-id)")
	idSetting            = workerSetting("id", "", "fixed worker UUID, overriding <base-dir>/worker-id")
	zoneSetting          = workerSetting("zone", "", "cluster placement label")
	endpointSetting      = workerSetting("endpoint", "", "address listed in cluster rosters")
	fetchSetting         = workerSetting("capabilities-fetch", "true", "advertise the fetch capability (clone repositories, prefetch flake inputs)")
	evalSetting          = workerSetting("capabilities-eval", "true", "advertise the eval capability (evaluate flakes)")
	buildSetting         = workerSetting("capabilities-build", "true", "advertise the build capability (run Nix builds)")
	federateSetting      = workerSetting("capabilities-federate", "false", "advertise the federate capability (reserved: negotiated only, no behaviour yet)")
	archSetting          = workerSetting("system-architectures", "", "comma list of Nix systems built for (default: the host system)")
	featuresSetting      = workerSetting("system-features", "", "comma list of Nix system features")
	cpuScoreSetting      = workerSetting("system-cpu-core-score", "0", "relative single-core speed; 0 measures it at start")
	maxBuildsSetting     = workerSetting("build-max-concurrent", "1", "build job slots")
	maxEvalsSetting      = workerSetting("eval-max-concurrent", "1", "flake job slots")
	discoverableSetting  = workerSetting("discoverable", "false", "accept server-dialed connections on --listen-addr:--port")
	listenAddrSetting    = workerSetting("listen-addr", "127.0.0.1", "address for server-dialed connections")
	portSetting          = workerSetting("port", "3100", "port for server-dialed connections")
	tlsCertSetting       = workerSetting("tls-cert-file", "", "TLS certificate of the listener")
	tlsKeySetting        = workerSetting("tls-key-file", "", "TLS key of the listener")
	insecureSetting      = workerSetting("insecure-listen", "false", "serve the listener without TLS (local and test setups only)")
	acceptedTokenSetting = workerSetting("accepted-server-tokens-file", "", "peer_id:hash lines a dialing server's tokens must match; without it every server is accepted")
	nixBinSetting        = workerSetting("nix-bin", "", "directory holding nix, nix-store and git (default: looked up in PATH)")
	gcRootsSetting       = workerSetting("gcroots-dir", "/nix/var/nix/gcroots/gradient", "GC root links pinning what running jobs need; empty disables")
	allowLocalSetting    = workerSetting("allow-local-repositories", "false", "let flake jobs fetch file:// URLs and local paths (off: a project cannot make the worker read repositories on its disk)")
	sshBinSetting        = workerSetting("ssh-bin", "ssh", "ssh program git uses with a project's deploy key")
	logBurstSetting      = workerSetting("log-burst-bytes-per-min", "8388608", "build log bytes one build may send per minute before its log is cut; 0 is unlimited")
	logSustainedSetting  = workerSetting("log-sustained-bytes-per-hour", "67108864", "build log bytes one build may send per hour before its log is cut; 0 is unlimited")
	maxCoresSetting      = workerSetting("build-max-cores", "0", "cores per build passed to Nix (--cores); 0 uses Nix's setting")
	metricsAddrSetting   = workerSetting("metrics-addr", "", "host:port serving Prometheus metrics at /metrics; empty disables")
	logLevelSetting      = workerSetting("log-level", "info", "debug, info, warn or error")
	logFormatSetting     = workerSetting("log-format", "text", "text or json")
)

var allSettings = []setting{serverURLSetting, peersSetting, peersFileSetting, baseDirSetting, idSetting,
	zoneSetting, endpointSetting, fetchSetting, evalSetting, buildSetting, federateSetting, archSetting, featuresSetting,
	cpuScoreSetting, maxBuildsSetting, maxEvalsSetting, discoverableSetting, listenAddrSetting, portSetting,
	tlsCertSetting, tlsKeySetting, insecureSetting, acceptedTokenSetting, nixBinSetting, sshBinSetting, allowLocalSetting, gcRootsSetting, maxCoresSetting, logBurstSetting, logSustainedSetting,
	metricsAddrSetting, logLevelSetting, logFormatSetting}

const usageIntroduction = `Usage: gradient-worker [flags]

Runs a Gradient worker: it dials the server (or is dialed by it with
--discoverable), authenticates with the tokens of its peers file and runs the
jobs it is assigned. Each flag can also be set by its environment variable;
a flag wins over the environment. SIGTERM or SIGINT drains and stops.

Flags:
`

// parseOptions reads flags, then the environment for every flag not given.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	vals, err := envflag.Parse("gradient-worker", args, allSettings, getenv, stderr, printUsage)
	if err != nil {
		return options{}, err
	}
	opts, err := buildOptions(vals.Get)
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
		NixBin: value(nixBinSetting), SSHBin: value(sshBinSetting), GCRootsDir: value(gcRootsSetting),
		MetricsAddr: value(metricsAddrSetting),
	}
	var errs []error
	boolean := func(s setting, dst *bool) {
		v, err := strconv.ParseBool(value(s))
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: want true or false", s.Flag, value(s)))
		}
		*dst = v
	}
	count := func(s setting, dst *int) {
		v, err := strconv.Atoi(value(s))
		if err != nil || v < 0 {
			errs = append(errs, fmt.Errorf("--%s %q: want a number ≥ 0", s.Flag, value(s)))
		}
		*dst = v
	}
	boolean(fetchSetting, &opts.Fetch)
	boolean(evalSetting, &opts.Eval)
	boolean(buildSetting, &opts.Build)
	boolean(federateSetting, &opts.Federate)
	boolean(discoverableSetting, &opts.Discoverable)
	boolean(insecureSetting, &opts.InsecureListen)
	boolean(allowLocalSetting, &opts.AllowLocalRepositories)
	count(maxBuildsSetting, &opts.MaxBuilds)
	count(maxEvalsSetting, &opts.MaxEvals)
	count(maxCoresSetting, &opts.BuildCores)
	var burst, sustained int
	count(logBurstSetting, &burst)
	count(logSustainedSetting, &sustained)
	opts.LogBurstPerMin, opts.LogSustainedPerHour = int64(burst), int64(sustained)
	if opts.MaxBuilds == 0 || opts.MaxEvals == 0 {
		errs = append(errs, errors.New("--build-max-concurrent and --eval-max-concurrent must be at least 1 (disable a kind with its capability)"))
	}
	var score, port int
	count(cpuScoreSetting, &score)
	count(portSetting, &port)
	opts.CPUCoreScore = uint32(score)
	if err := opts.LogLevel.UnmarshalText([]byte(value(logLevelSetting))); err != nil {
		errs = append(errs, fmt.Errorf("--%s %q: want debug, info, warn or error", logLevelSetting.Flag, value(logLevelSetting)))
	}
	if opts.LogFormat != "text" && opts.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--%s %q: want text or json", logFormatSetting.Flag, opts.LogFormat))
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

func printUsage(w io.Writer) { envflag.PrintUsage(w, usageIntroduction, allSettings) }
