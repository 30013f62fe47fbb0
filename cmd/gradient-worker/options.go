package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/internal/servicecli"
	"gradient.dev/gradient/nix/narsig"
)

// errUsage marks a configuration error already explained on stderr.
var errUsage = servicecli.ErrUsage

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
	EvalShards, EvalMaxMemoryMiB        int
	EvalBuildNice                       int
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
	DrainTimeout                        time.Duration // 0 aborts running jobs at once on stop
	// HTTP bounds what a client may hold of the listener and /metrics.
	HTTP                   httpguard.Timeouts
	Discoverable           bool
	ListenAddr             string // host:port, set when discoverable
	TLSCertFile            string
	TLSKeyFile             string
	InsecureListen         bool
	AcceptedTokenFile      string
	AllowLocalRepositories bool
	// TrustedKeys vouch for pulled input-addressed paths (beside Nix's
	// own trusted-public-keys); RequireSigs off takes unsigned ones too.
	TrustedKeys *narsig.Keys
	RequireSigs bool
	LogLevel    slog.Level
	LogFormat   string
	// Store GC (storegc.go): collect below GCMinFree free bytes (0: off)
	// until GCMaxFree are free (0: every dead path).
	GCMinFree, GCMaxFree uint64
	GCCheckInterval      time.Duration
}

const description = `Runs a Gradient worker: it dials the server (or is dialed by it with
--discoverable), authenticates with the tokens of its peers file and runs the
jobs it is assigned. SIGTERM or SIGINT drains: the worker sends Draining, takes
no more jobs and lets the running ones finish for up to --drain-timeout-secs;
a second signal, or the timeout, aborts what still runs (reported Canceled)
and the worker exits.

Each flag can also be set by its environment variable, GRADIENT_WORKER_ and
the flag's name (the reference's names); a flag wins over the variable. A
boolean flag alone means true; --flag=false turns it off.`

// workerVar is the variable of a flag: GRADIENT_WORKER_ plus the name
// upper-cased (docs/protocol/worker.md §2.1).
func workerVar(flag string) string {
	return "GRADIENT_WORKER_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// command is the worker's flag set: the flags write into opts and the
// strings the caller parses after (lists, the listener's host and port).
func command(opts *options, raw *rawOptions, env *servicecli.Env, logging *servicecli.Logging) *cli.Command {
	str := func(name string, dst *string, def, usage string) *cli.StringFlag {
		return &cli.StringFlag{Name: name, Value: def, Destination: dst, Sources: env.Vars(workerVar(name)), Usage: usage}
	}
	file := func(name string, dst *string, def, usage string) *cli.StringFlag {
		f := str(name, dst, def, usage)
		f.TakesFile = true
		return f
	}
	boolean := func(name string, dst *bool, def bool, usage string) *cli.BoolFlag {
		if def {
			usage += "; on by default, --" + name + "=false turns it off"
		}
		return &cli.BoolFlag{Name: name, Value: def, Destination: dst, Sources: env.Vars(workerVar(name)), Usage: usage}
	}
	count := func(name string, dst *int, def int, usage string, check func(int) error) *cli.IntFlag {
		return &cli.IntFlag{Name: name, Value: def, Destination: dst, Sources: env.Vars(workerVar(name)), Usage: usage, Validator: check}
	}
	bytes := func(name string, dst *int64, def int64, usage string) *cli.Int64Flag {
		return &cli.Int64Flag{Name: name, Value: def, Destination: dst, Sources: env.Vars(workerVar(name)), Usage: usage,
			Validator: servicecli.NotNegative[int64]}
	}
	notNegative, positive := servicecli.NotNegative[int], servicecli.Positive[int]
	flags := []cli.Flag{
		str("server-url", &opts.ServerURL, "", "ws(s)://host/proto URL of the server to dial (required unless discoverable)"),
		str("peers", &opts.Peers, "", "inline peers list, peer_id:token lines (prefer --peers-file: flags show in ps)"),
		file("peers-file", &opts.PeersFile, "", "peers file (peer_id:token lines), watched for changes; wins over --peers"),
		file("base-dir", &opts.BaseDir, "/var/lib/gradient-worker", "state directory: worker-id, and work/ for the build hook and temporary clones"),
		str("id", &opts.ID, "", "fixed worker UUID, overriding <base-dir>/worker-id"),
		str("zone", &opts.Zone, "", "cluster placement label"),
		str("endpoint", &opts.Endpoint, "", "address listed in cluster rosters"),
		boolean("capabilities-fetch", &opts.Fetch, true, "advertise the fetch capability (clone repositories, prefetch flake inputs)"),
		boolean("capabilities-eval", &opts.Eval, true, "advertise the eval capability (evaluate flakes)"),
		boolean("capabilities-build", &opts.Build, true, "advertise the build capability (run Nix builds)"),
		boolean("capabilities-federate", &opts.Federate, false, "advertise the federate capability (reserved: negotiated only, no behaviour yet)"),
		str("system-architectures", &raw.architectures, "", "comma list of Nix systems built for (default: the local Nix's system and extra-platforms)"),
		str("system-features", &raw.features, "", "comma list of Nix system features (default: the local Nix's)"),
		&cli.Uint32Flag{Name: "system-cpu-core-score", Destination: &opts.CPUCoreScore, Sources: env.Vars(workerVar("system-cpu-core-score")),
			Usage: "relative single-core speed; 0 measures it at start"},
		// 32 as the reference's NixOS module (docs/protocol/config.md build.maxConcurrent),
		// whose defaults the capabilities and drain timeout follow too; its
		// binary alone said 1 (docs/protocol/worker.md §2.1).
		count("build-max-concurrent", &opts.MaxBuilds, 32, "build job slots, advertised to the server as max_concurrent_builds (each build gets --build-max-cores)", positive),
		count("eval-max-concurrent", &opts.MaxEvals, 1, "flake job slots", positive),
		&servicecli.SecondsFlag{Name: "drain-timeout-secs", Value: 60 * time.Second, Destination: &opts.DrainTimeout,
			Sources: env.Vars(workerVar("drain-timeout-secs")),
			Usage:   "on SIGTERM, let running jobs finish this long (60, 1m) before aborting them; 0 aborts at once"},
		boolean("discoverable", &opts.Discoverable, false, "accept server-dialed connections on --listen-addr:--port"),
		str("listen-addr", &raw.listenHost, "127.0.0.1", "address for server-dialed connections"),
		count("port", &raw.port, 3100, "port for server-dialed connections", func(n int) error {
			if n < 0 || n > 65535 {
				return errors.New("want a port, 0 to 65535")
			}
			return nil
		}),
		file("tls-cert-file", &opts.TLSCertFile, "", "TLS certificate of the listener"),
		file("tls-key-file", &opts.TLSKeyFile, "", "TLS key of the listener"),
		boolean("insecure-listen", &opts.InsecureListen, false, "serve the listener without TLS (local and test setups only)"),
		file("accepted-server-tokens-file", &opts.AcceptedTokenFile, "", "peer_id:hash lines a dialing server's tokens must match; without it every server is accepted"),
		file("nix-bin", &opts.NixBin, "", "directory holding nix, nix-store and git (default: looked up in PATH)"),
		str("ssh-bin", &opts.SSHBin, "ssh", "ssh program git uses with a project's deploy key"),
		boolean("allow-local-repositories", &opts.AllowLocalRepositories, false, "let flake jobs fetch file:// URLs and local paths (off: a project cannot make the worker read repositories on its disk)"),
		str("trusted-public-keys", &raw.trustedKeys, "", "binary-cache keys (NAME:base64, as `gradient cache create` prints them; separated by spaces or commas) whose signature lets a pulled input-addressed path into the Nix store, beside the keys of Nix's own trusted-public-keys"),
		boolean("require-sigs", &opts.RequireSigs, true, "import a pulled input-addressed path only when a trusted key signed it (off only for a store no one else uses: any server could then plant any path in it)"),
		file("gcroots-dir", &opts.GCRootsDir, "/nix/var/nix/gcroots/gradient", "GC root links pinning what running jobs need; empty disables"),
		count("build-max-cores", &opts.BuildCores, 0, "cores per build passed to Nix (--cores); 0 uses Nix's setting", notNegative),
		count("eval-shards", &opts.EvalShards, 0, "Nix processes evaluating one flake, each over a shard of its attributes; 0 uses the CPU count (at most 4)", notNegative),
		count("eval-build-nice", &opts.EvalBuildNice, 10, "lower the CPU priority (nice) of builds that start while this worker evaluates a flake by this much, 0 to 19, so its evaluation keeps its share of the CPU; only builds through the nix-daemon children the worker starts when no system daemon listens; 0 is off", func(n int) error {
			if n < 0 || n > 19 {
				return errors.New("want 0 to 19")
			}
			return nil
		}),
		count("eval-max-memory-mib", &opts.EvalMaxMemoryMiB, 0, "resident memory (MiB) past which an evaluating Nix process is replaced, the walk resuming where it was; 0 is unbounded", notNegative),
		bytes("log-burst-bytes-per-min", &opts.LogBurstPerMin, 8<<20, "build log bytes one build may send per minute before its log is cut; 0 is unlimited"),
		bytes("log-sustained-bytes-per-hour", &opts.LogSustainedPerHour, 64<<20, "build log bytes one build may send per hour before its log is cut; 0 is unlimited"),
		str("metrics-addr", &opts.MetricsAddr, "", "host:port serving Prometheus metrics at /metrics; empty disables"),
		str("gc-min-free", &raw.gcMinFree, "0", "collect the Nix store's garbage when its file system has less than this free (bytes; K, M, G, T suffixes); 0 never collects"),
		str("gc-max-free", &raw.gcMaxFree, "0", "a collection frees until this much is free; 0 (or not above --gc-min-free) deletes every dead path"),
		&servicecli.SecondsFlag{Name: "gc-check-interval-secs", Value: time.Minute, Destination: &opts.GCCheckInterval,
			Sources: env.Vars(workerVar("gc-check-interval-secs")), Usage: "how often the free space is checked with --gc-min-free (besides after each job)"},
	}
	flags = append(flags, servicecli.HTTPTimeoutFlags(&opts.HTTP, func(name string) cli.ValueSourceChain { return env.Vars(workerVar(name)) })...)
	flags = append(flags, logging.Flags(env, "GRADIENT_WORKER_")...)
	return &cli.Command{Name: "gradient-worker", Usage: "a Gradient CI worker", Description: description, Flags: flags}
}

// rawOptions are flag values that options holds in another form.
type rawOptions struct {
	architectures, features string
	trustedKeys             string
	listenHost              string
	port                    int
	gcMinFree, gcMaxFree    string
}

// parseOptions reads flags, then the environment for every flag not given.
// It returns servicecli.ErrHelp after -h and errUsage (explained on
// stderr) for a bad configuration.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var opts options
	var raw rawOptions
	var logging servicecli.Logging
	cmd := command(&opts, &raw, servicecli.NewEnv(getenv), &logging)
	err := servicecli.Parse(context.Background(), cmd, args, stderr, func() error {
		opts.LogLevel, opts.LogFormat = logging.Level(), logging.Format()
		opts.Architectures, opts.SystemFeatures = commaList(raw.architectures), commaList(raw.features)
		return checkOptions(&opts, raw)
	})
	if err != nil {
		return options{}, err
	}
	return opts, nil
}

// checkOptions validates what one flag alone cannot, and sets the
// listener's address.
func checkOptions(opts *options, raw rawOptions) error {
	var errs []error
	if opts.BaseDir == "" && opts.ID == "" {
		errs = append(errs, errors.New("--base-dir may not be empty without --id"))
	}
	if opts.Discoverable {
		opts.ListenAddr = net.JoinHostPort(raw.listenHost, strconv.Itoa(raw.port))
		if !opts.InsecureListen && (opts.TLSCertFile == "" || opts.TLSKeyFile == "") {
			errs = append(errs, errors.New("--discoverable needs --tls-cert-file and --tls-key-file (or --insecure-listen)"))
		}
	} else if opts.ServerURL == "" {
		errs = append(errs, errors.New("--server-url is required (unless --discoverable)"))
	}
	keys, err := narsig.ParseKeys(raw.trustedKeys)
	if err != nil {
		errs = append(errs, fmt.Errorf("--trusted-public-keys: %w", err))
	}
	if keys.Len() > 0 {
		opts.TrustedKeys = keys
	}
	var gcErr error
	if opts.GCMinFree, gcErr = parseSize(raw.gcMinFree); gcErr != nil {
		errs = append(errs, fmt.Errorf("--gc-min-free %w", gcErr))
	}
	if opts.GCMaxFree, gcErr = parseSize(raw.gcMaxFree); gcErr != nil {
		errs = append(errs, fmt.Errorf("--gc-max-free %w", gcErr))
	}
	if opts.GCCheckInterval <= 0 {
		errs = append(errs, errors.New("--gc-check-interval-secs must be positive"))
	}
	if opts.ServerURL != "" && !strings.HasPrefix(opts.ServerURL, "ws://") && !strings.HasPrefix(opts.ServerURL, "wss://") {
		errs = append(errs, fmt.Errorf("--server-url %q: want a ws:// or wss:// URL", gitsource.Redact(opts.ServerURL)))
	}
	return errors.Join(errs...)
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
