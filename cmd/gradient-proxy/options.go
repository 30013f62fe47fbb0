package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
	"github.com/urfave/cli/v3"

	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/internal/servicecli"
	"gradient.dev/gradient/proxy/hetzner"
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/wire"
)

// options is the proxy's configuration after flags and environment.
type options struct {
	Listen            string
	Database          string
	EncryptionKeyFile string
	// AdminToken is the file's content, hashed at start-up and dropped.
	AdminToken           string
	UpstreamCapabilities wire.GradientCapabilities
	// AuthFailures is how many wrong admin tokens one address may send
	// per minute (then 429); 0 does not limit.
	AuthFailures int
	Hetzner      hetznerOptions
	// HTTP bounds what a client may hold of the listener.
	HTTP      httpguard.Timeouts
	LogLevel  slog.Level
	LogFormat string

	// AllowLinkLocalLinks lets links name link-local and cloud metadata
	// addresses, at set time and at dial time.
	AllowLinkLocalLinks bool
	// Tenant bounds what one tenant's server makes the proxy hold.
	Tenant hub.Limits
}

// hetznerOptions configure the Hetzner Cloud workers; Token empty turns
// them off.
type hetznerOptions struct {
	// Token is the token file's content (never logged).
	Token    string
	Endpoint string
	// ProtoURL is the proxy's /proto as the VMs reach it.
	ProtoURL                               string
	Interval, BillingUnit, ScaleDownWindow time.Duration
	BootDeadline, DrainGrace, ListGrace    time.Duration
	BackoffInitial, BackoffMax             time.Duration
	BootBackoffMax                         time.Duration
}

// defaultHetzner is hetznerOptions without a token: the reconciler's
// defaults.
func defaultHetzner() hetznerOptions {
	return hetznerOptions{Endpoint: hcloud.Endpoint, Interval: hetzner.DefaultInterval, BillingUnit: hetzner.DefaultBillingUnit,
		ScaleDownWindow: hetzner.DefaultScaleDownWindow, BootDeadline: hetzner.DefaultBootDeadline, DrainGrace: hetzner.DefaultDrainGrace,
		ListGrace: hetzner.DefaultListGrace, BackoffInitial: hetzner.DefaultBackoffMin, BackoffMax: hetzner.DefaultBackoffMax,
		BootBackoffMax: hetzner.DefaultBootBackoffMax}
}

const description = `Runs the Gradient federation proxy: each tenant's Gradient server sees it as
one worker. For every tenant whose upstream link is enabled (and who may
run) it holds one worker session to the tenant's server, authenticated with
the peer tokens the tenant handed over (sealed in the database under the
encryption key), and reports the aggregate hardware of that tenant's
connected, non-draining workers. A 401 or 403 from the tenant's server marks
the link failing with the server's reason; the proxy does not dial it again
until the link is set again.

The proxy's own workers connect to its /proto as to a server: each is
authorized from its row (the token against the row's argon2id hash; an
unknown ID gets 403, a wrong token 401), negotiates its offer AND the row's
allowed capabilities (never federate), and counts in its tenant's upstream
aggregate while connected. It serves /proto, the admin API under /api/v1
(bearer admin token from --admin-token-file), /healthz and /metrics (the
upstream sessions' series carry tenant="<tenant ID>").

Jobs are forwarded per tenant: the tenant's server offers and assigns jobs
to the proxy's session, and the proxy hands each to the best capable waiting
worker of that tenant (or declines), routes the reports back and passes NAR
pulls, cache queries and uploads through to the tenant's server, which stays
the cache; nothing is stored on the proxy. A worker lost mid-job fails it
upstream as transient; a lost upstream session aborts the tenant's jobs and
closes its workers' sessions after Draining. Frames never cross tenants.

A deployment:
  1. The tenant registers a worker ID for the proxy on their server and
     hands the worker ID and the printed peers line PROJECT_ID:TOKEN to the
     operator:
       gradient worker register --project TEAM/PROJECT
     (or --worker-id PROXY_ID to reuse an ID; one line per project).
  2. The operator, with GRADIENT_PROXY_URL and GRADIENT_PROXY_ADMIN_TOKEN_FILE
     set (or --proxy and --proxy-token-file):
       gradient proxy tenant create acme
       gradient proxy link set acme --url wss://ci.acme.example/proto \
           --worker-id WORKER_ID --peers-file acme.peers
       gradient proxy link status acme
       gradient proxy worker create acme --name builder-1
     worker create prints the worker's ID and token once, and its peers
     line WORKER_ID:TOKEN.
  3. On each machine: gradient-worker --id WORKER_ID
     --server-url ws://PROXY:3200/proto --peers-file FILE, FILE holding
     that WORKER_ID:TOKEN line.
  gradient proxy worker list and gradient proxy sessions show the live
  sessions; gradient proxy worker revoke ID closes a worker's at once.

With a Hetzner token file and the proxy's /proto URL as the VMs reach it,
the proxy boots Hetzner Cloud VMs for the tenants whose Hetzner
configuration is enabled, one reconcile pass per interval: up to min(max
VMs, ceil(pending / slots)) per system from the worker snapshot, deleted
when idle in the last scale-down window of their billing unit, when not
connected within the boot deadline, or a drain grace after the tenant's
link failed or the tenant was stopped. Pending jobs are the build
candidates the tenant's server offers the proxy, per system.

Each flag can also be set by its environment variable, listed beside it. A
flag wins over the variable. Secrets are read from files only.`

func proxyVar(flag string) string {
	return "GRADIENT_PROXY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// command is the proxy's flag set; capabilities and the admin token
// file are resolved after parsing.
func command(opts *options, raw *rawOptions, env *servicecli.Env, logging *servicecli.Logging) *cli.Command {
	str := func(name string, dst *string, def, usage string) *cli.StringFlag {
		return &cli.StringFlag{Name: name, Value: def, Destination: dst, Sources: env.Vars(proxyVar(name)), Usage: usage}
	}
	seconds := func(name string, dst *time.Duration, def time.Duration, usage string) *servicecli.SecondsFlag {
		return &servicecli.SecondsFlag{Name: name, Value: def, Destination: dst, Sources: env.Vars(proxyVar(name)), Usage: usage}
	}
	file := func(name string, dst *string, usage string) *cli.StringFlag {
		f := str(name, dst, "", usage)
		f.TakesFile = true
		return f
	}
	flags := []cli.Flag{
		str("listen", &opts.Listen, "127.0.0.1:3200", "address serving /proto, /api/v1, /healthz and /metrics"),
		&cli.StringFlag{Name: "database", Value: "./gradient-proxy-data", Destination: &opts.Database, Sources: env.Vars(proxyVar("database")), TakesFile: true,
			Usage: "a postgres:// URL, or a data directory for embedded SQLite (a password in the URL is never logged)"},
		file("encryption-key-file", &opts.EncryptionKeyFile,
			"32-byte key (raw or base64) sealing the tenants' upstream tokens in the database (required: the proxy refuses to start without it)"),
		file("admin-token-file", &raw.adminTokenFile,
			"file holding the admin API token (/api/v1, used by gradient proxy …), hashed at start-up; without it the admin API answers 503"),
		&cli.IntFlag{Name: "auth-failures-per-minute", Value: 30, Destination: &opts.AuthFailures, Sources: env.Vars(proxyVar("auth-failures-per-minute")),
			Validator: servicecli.NotNegative[int],
			Usage:     "wrong admin tokens one client address may send per minute; beyond them it gets HTTP 429 until it regains attempts at that rate; 0 disables"},
		&cli.BoolFlag{Name: "allow-link-local-links", Destination: &opts.AllowLinkLocalLinks, Sources: env.Vars(proxyVar("allow-link-local-links")),
			Usage: "let tenants' link URLs name link-local addresses (169.254.0.0/16, fe80::/10) and cloud metadata services (169.254.169.254, fd00:ec2::254), " +
				"checked when a link is set and at every dial; off, they are refused (loopback stays allowed)"},
		&cli.IntFlag{Name: "tenant-max-candidates", Value: hub.DefaultLimits.BookCandidates, Destination: &opts.Tenant.BookCandidates,
			Sources: env.Vars(proxyVar("tenant-max-candidates")), Validator: servicecli.Positive[int],
			Usage: "job candidates the proxy holds of one tenant's offers (and of a job list being received); its server's excess is dropped, counted and logged"},
		&cli.IntFlag{Name: "tenant-max-candidate-mib", Value: int(hub.DefaultLimits.BookBytes >> 20), Destination: &raw.tenantCandidateMiB,
			Sources: env.Vars(proxyVar("tenant-max-candidate-mib")), Validator: servicecli.Positive[int],
			Usage: "MiB of memory those candidates may take, as the proxy estimates it"},
		str("upstream-capabilities", &raw.capabilities, "fetch,eval,build",
			"comma list of the capabilities every upstream session offers: fetch, eval, build, federate"),
		file("hetzner-token-file", &raw.hetznerTokenFile, "file holding the Hetzner Cloud API token; without it no VM is booted"),
		str("hetzner-endpoint", &opts.Hetzner.Endpoint, hcloud.Endpoint, "Hetzner Cloud API endpoint"),
		str("hetzner-proto-url", &opts.Hetzner.ProtoURL, "", "ws(s):// URL of this proxy's /proto as the VMs reach it (required with --hetzner-token-file)"),
		seconds("hetzner-reconcile-interval", &opts.Hetzner.Interval, hetzner.DefaultInterval, "seconds between reconcile passes"),
		seconds("hetzner-billing-unit", &opts.Hetzner.BillingUnit, hetzner.DefaultBillingUnit, "seconds of a VM's billing unit"),
		seconds("hetzner-scale-down-window", &opts.Hetzner.ScaleDownWindow, hetzner.DefaultScaleDownWindow,
			"an idle VM is deleted only within this many last seconds of its billing unit"),
		seconds("hetzner-boot-deadline", &opts.Hetzner.BootDeadline, hetzner.DefaultBootDeadline,
			"seconds a VM has to connect before it is deleted as failed_boot, and a connected VM's worker may stay away before it is deleted as lost"),
		seconds("hetzner-drain-grace", &opts.Hetzner.DrainGrace, hetzner.DefaultDrainGrace,
			"seconds from Draining to deletion when a tenant's link fails or it may not run"),
		seconds("hetzner-list-grace", &opts.Hetzner.ListGrace, hetzner.DefaultListGrace,
			"seconds a server list may lag behind a creation before the leak guard acts"),
		seconds("hetzner-backoff-initial", &opts.Hetzner.BackoffInitial, hetzner.DefaultBackoffMin,
			"seconds a tenant backs off after a failed API call (429, 5xx), doubling"),
		seconds("hetzner-backoff-max", &opts.Hetzner.BackoffMax, hetzner.DefaultBackoffMax, "longest backoff in seconds"),
		seconds("hetzner-boot-backoff-max", &opts.Hetzner.BootBackoffMax, hetzner.DefaultBootBackoffMax,
			"after consecutive failed boots of a system the next VM waits the boot deadline, doubling per failure, at most this many seconds"),
	}
	flags = append(flags, servicecli.HTTPTimeoutFlags(&opts.HTTP, func(name string) cli.ValueSourceChain { return env.Vars(proxyVar(name)) })...)
	flags = append(flags, logging.Flags(env, "GRADIENT_PROXY_")...)
	return &cli.Command{Name: "gradient-proxy", Usage: "the Gradient federation proxy", Description: description, Flags: flags}
}

// rawOptions are flag values options holds in another form.
type rawOptions struct {
	capabilities     string
	adminTokenFile   string
	hetznerTokenFile string

	tenantCandidateMiB int
}

// parseOptions reads flags, then the environment for every flag not given.
// It returns servicecli.ErrHelp after -h and servicecli.ErrUsage
// (explained on stderr) for a bad configuration.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var opts options
	var raw rawOptions
	var logging servicecli.Logging
	cmd := command(&opts, &raw, servicecli.NewEnv(getenv), &logging)
	err := servicecli.Parse(context.Background(), cmd, args, stderr, func() error {
		opts.LogLevel, opts.LogFormat = logging.Level(), logging.Format()
		var errs []error
		if opts.Listen == "" || opts.Database == "" {
			errs = append(errs, errors.New("--listen and --database may not be empty"))
		}
		if opts.EncryptionKeyFile == "" {
			errs = append(errs, errors.New("--encryption-key-file (GRADIENT_PROXY_ENCRYPTION_KEY_FILE) is required: it seals the tenants' upstream tokens"))
		}
		var err error
		if opts.UpstreamCapabilities, err = parseCapabilities(raw.capabilities); err != nil {
			errs = append(errs, fmt.Errorf("--upstream-capabilities: %w", err))
		}
		if raw.adminTokenFile != "" {
			if opts.AdminToken, err = readToken("admin token", raw.adminTokenFile); err != nil {
				errs = append(errs, err)
			}
		}
		if raw.hetznerTokenFile != "" {
			if opts.Hetzner.Token, err = readToken("Hetzner token", raw.hetznerTokenFile); err != nil {
				errs = append(errs, err)
			}
			if !strings.HasPrefix(opts.Hetzner.ProtoURL, "ws://") && !strings.HasPrefix(opts.Hetzner.ProtoURL, "wss://") {
				errs = append(errs, errors.New("--hetzner-token-file needs --hetzner-proto-url, the ws:// or wss:// URL of this proxy's /proto as the VMs reach it"))
			}
		}
		opts.Tenant.BookBytes = int64(raw.tenantCandidateMiB) << 20
		opts.Tenant.PendingQueries, opts.Tenant.PendingUploads = hub.DefaultLimits.PendingQueries, hub.DefaultLimits.PendingUploads
		h := opts.Hetzner
		if h.Interval <= 0 || h.BillingUnit <= 0 || h.ScaleDownWindow <= 0 || h.BootDeadline <= 0 || h.DrainGrace <= 0 ||
			h.ListGrace <= 0 || h.BackoffInitial <= 0 || h.BackoffMax < h.BackoffInitial || h.BootBackoffMax <= 0 {
			errs = append(errs, errors.New("the --hetzner-* durations must be positive, and --hetzner-backoff-max at least --hetzner-backoff-initial"))
		}
		if h.ScaleDownWindow > h.BillingUnit {
			errs = append(errs, errors.New("--hetzner-scale-down-window is longer than --hetzner-billing-unit"))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return options{}, err
	}
	return opts, nil
}

// parseCapabilities reads "fetch,eval,build": core and cache are a
// server's, and an empty set would make a session that does nothing.
func parseCapabilities(s string) (wire.GradientCapabilities, error) {
	var c wire.GradientCapabilities
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		one, ok := wire.CapabilityNamed(name)
		if !ok || one.Core || one.Cache {
			return c, fmt.Errorf("unknown capability %q: want fetch, eval, build or federate", name)
		}
		c = c.Or(one)
	}
	if !c.Fetch && !c.Eval && !c.Build {
		return c, errors.New("want at least one of fetch, eval and build")
	}
	return c, nil
}

func readToken(what, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s file: %w", what, err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("%s file %s is empty", what, file)
	}
	return token, nil
}
