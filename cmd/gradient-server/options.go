package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/internal/servicecli"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/server/scheduler"
)

// errUsage marks a configuration error already explained on stderr.
var errUsage = servicecli.ErrUsage

// options is the server's configuration after flags and environment.
type options struct {
	Listen      string
	Database    string
	AdminToken  string // plaintext; hashed at start-up and then dropped
	DialKeyFile string
	NarDir      string // empty: the SQLite data directory, or ./gradient-data
	// NarStore is "local", "s3" or an s3:// URL; S3 its settings (the
	// credentials resolved at parse time, never logged).
	NarStore           string
	S3                 s3store.Config
	S3CredentialsFile  string
	NarHTTP            string // redirect | stream
	NarPresignUploads  bool
	MultipartThreshold int64
	// PresignedPullMinBytes: Pull answers carry presigned GETs for objects
	// larger than this; 0: for every object.
	PresignedPullMinBytes int64
	HeartbeatTimeout      time.Duration
	PollInterval          time.Duration // 0: no branch polling
	// Garbage collection of the binary cache (server/retention).
	GCInterval      time.Duration // 0: only on demand
	GCGrace         time.Duration
	KeepEvaluations int
	ExternalURL     string // the server's address for forges and users
	// AllowLocalRepositories lets projects name file:// URLs and local
	// paths (the API, the branch poll and eval start).
	AllowLocalRepositories bool
	MaxConnections         int
	AuthFailures           int // per minute and client address; 0: no limit
	HandshakesPerIP        int
	// AnonymousCache lets read-only cache sessions of public caches in
	// without a key; AnonymousCachePerIP caps them per client IP.
	AnonymousCache      bool
	AnonymousCachePerIP int
	// Limits of builds whose derivation sets no timeout / maxSilent; 0
	// disables the limit.
	BuildDefaultTimeoutSecs   uint64
	BuildDefaultMaxSilentSecs uint64
	BuildMaxAttempts          int
	BuildRetryBackoff         time.Duration
	// Federate offers the reserved federate capability.
	Federate bool
	// Discoverable dials registrations and team workers with a URL;
	// off, they are kept but only workers that connect themselves run.
	Discoverable bool
	// Server instances sharing one PostgreSQL database (server/instance):
	// this one's ID ("" random), its lease and renewal period, and whether
	// a change of the shared settings is accepted.
	InstanceID         string
	InstanceLease      time.Duration
	InstanceRenew      time.Duration
	AcceptConfigChange bool
	// HTTP bounds what a client may hold of the listener.
	HTTP      httpguard.Timeouts
	LogLevel  slog.Level
	LogFormat string
}

const description = `Runs the Gradient server: workers connect to /proto, the admin API is under
/api/v1 (use the gradient CLI), metrics are at /metrics, health at /healthz.

Each flag can also be set by the environment variables listed beside it. A
flag wins over the variables; of two variables set, the first listed wins
(the reference's GRADIENT_PROTO_* names come second, so a deployment of its
NixOS module runs unchanged). A boolean flag alone means true; --flag=false
turns it off. Without an admin token the admin API answers 503. The admin
token is hashed at start-up; only the hash is kept.`

// command is the server's flag set bound to opts, reading variables
// through env; the admin token pair is resolved after parsing.
func command(opts *options, env *servicecli.Env, logging *servicecli.Logging) (*cli.Command, *adminTokenFlags) {
	tokens := &adminTokenFlags{
		token: &cli.StringFlag{Name: "admin-token", Sources: env.Vars("GRADIENT_ADMIN_TOKEN"),
			Usage: "admin API token (prefer the file: flags show in ps)", HideDefault: true},
		file: &cli.StringFlag{Name: "admin-token-file", Sources: env.Vars("GRADIENT_ADMIN_TOKEN_FILE"), TakesFile: true,
			Usage: "file holding the admin API token"},
	}
	flags := []cli.Flag{
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:3000", Destination: &opts.Listen, Sources: env.Vars("GRADIENT_LISTEN"),
			Usage: "address to listen on"},
		&cli.StringFlag{Name: "database", Value: "./gradient-data", Destination: &opts.Database, Sources: env.Vars("GRADIENT_DATABASE"), TakesFile: true,
			Usage: "a postgres:// URL, or a data directory for embedded SQLite (a password in the URL is never logged; PGPASSWORD and ~/.pgpass work too)"},
		tokens.token, tokens.file,
		&cli.StringFlag{Name: "dial-key-file", Destination: &opts.DialKeyFile, Sources: env.Vars("GRADIENT_DIAL_KEY_FILE"), TakesFile: true,
			Usage: "32-byte key (raw or base64) sealing the server's secrets at rest: tokens of workers it dials, projects' deploy keys and caches' signing keys; without it, registrations with a URL and deploy keys are refused and signing keys are stored in the clear"},
		&cli.StringFlag{Name: "nar-dir", Destination: &opts.NarDir, Sources: env.Vars("GRADIENT_NAR_DIR"), TakesFile: true,
			Usage: "directory of the binary caches' NAR store (NARs go under nars/); default: the SQLite data directory, or ./gradient-data"},
		&cli.StringFlag{Name: "nar-store", Value: "local", Destination: &opts.NarStore, Sources: env.Vars("GRADIENT_NAR_STORE"),
			Validator: validNarStore,
			Usage:     "where NARs are kept: local (--nar-dir), s3 (the --s3-* flags), or s3://BUCKET/PREFIX?endpoint=URL&region=R&path-style=true"},
		&cli.StringFlag{Name: "s3-endpoint", Destination: &opts.S3.Endpoint, Sources: env.Vars("GRADIENT_S3_ENDPOINT"),
			Usage: "S3-compatible store's base URL as the server reaches it (https://s3.example.com); empty: AWS for the region"},
		&cli.StringFlag{Name: "s3-presign-endpoint", Destination: &opts.S3.PresignEndpoint, Sources: env.Vars("GRADIENT_S3_PRESIGN_ENDPOINT"),
			Usage: "base URL put into presigned URLs when workers and Nix clients reach the store under another name than the server; default: --s3-endpoint"},
		&cli.StringFlag{Name: "s3-bucket", Destination: &opts.S3.Bucket, Sources: env.Vars("GRADIENT_S3_BUCKET"),
			Usage: "bucket of the NARs (not versioned; see the README for its policy and lifecycle)"},
		&cli.StringFlag{Name: "s3-region", Value: "us-east-1", Destination: &opts.S3.Region, Sources: env.Vars("GRADIENT_S3_REGION"),
			Usage: "region the requests are signed for"},
		&cli.StringFlag{Name: "s3-prefix", Destination: &opts.S3.Prefix, Sources: env.Vars("GRADIENT_S3_PREFIX"),
			Usage: "key prefix of every object (gradient/ keeps them under gradient/)"},
		&cli.BoolFlag{Name: "s3-path-style", Destination: &opts.S3.PathStyle, Sources: env.Vars("GRADIENT_S3_PATH_STYLE"),
			Usage: "address the bucket as ENDPOINT/BUCKET/KEY (MinIO, versitygw, Garage) instead of BUCKET.ENDPOINT/KEY"},
		&cli.StringFlag{Name: "s3-credentials-file", Destination: &opts.S3CredentialsFile, Sources: env.Vars("GRADIENT_S3_CREDENTIALS_FILE"), TakesFile: true,
			Usage: "AWS-style credentials file ([default] aws_access_key_id, aws_secret_access_key); without it AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN are read"},
		&cli.StringFlag{Name: "nar-http", Value: "redirect", Destination: &opts.NarHTTP, Sources: env.Vars("GRADIENT_NAR_HTTP"),
			Validator: func(v string) error {
				if v != "redirect" && v != "stream" {
					return errors.New("want redirect or stream")
				}
				return nil
			},
			Usage: "with an S3 store, answer the HTTP cache's NAR requests with a redirect to a presigned GET (redirect) or send the bytes through the server (stream)"},
		&cli.BoolFlag{Name: "nar-presigned-uploads", Value: true, Destination: &opts.NarPresignUploads, Sources: env.Vars("GRADIENT_NAR_PRESIGNED_UPLOADS"),
			Usage: "with an S3 store, grant workers presigned PUT and multipart URLs; =false relays every upload through the server"},
		&cli.Int64Flag{Name: "nar-multipart-threshold", Value: 1 << 30, Destination: &opts.MultipartThreshold, Sources: env.Vars("GRADIENT_NAR_MULTIPART_THRESHOLD"),
			Validator: servicecli.Positive[int64],
			Usage:     "NAR size in bytes above which a presigned upload is multipart (parts of at least 64 MiB) instead of one PUT"},
		&cli.Int64Flag{Name: "nar-presigned-pull-min-bytes", Destination: &opts.PresignedPullMinBytes, Sources: env.Vars("GRADIENT_NAR_PRESIGNED_PULL_MIN_BYTES"),
			Validator: func(n int64) error {
				if n < 0 {
					return errors.New("want 0 or more bytes")
				}
				return nil
			},
			Usage: "with an S3 store, workers' pulls of objects up to this many compressed bytes stream through the server (and any proxy) instead of a presigned GET; 0: every pull is a presigned GET"},
		&servicecli.SecondsFlag{Name: "heartbeat-timeout", Value: 120 * time.Second,
			Destination: &opts.HeartbeatTimeout, Sources: env.Vars("GRADIENT_HEARTBEAT_TIMEOUT", "GRADIENT_PROTO_WORKER_HEARTBEAT_TIMEOUT_SECS"),
			Usage: "drop a worker silent this long (120s, 2m or plain seconds); 0 disables"},
		&servicecli.SecondsFlag{Name: "poll-interval", Value: time.Minute, Destination: &opts.PollInterval, Sources: env.Vars("GRADIENT_POLL_INTERVAL"),
			Usage: "poll each project's branch this often, starting an evaluation for a new head; 0 disables"},
		&servicecli.SecondsFlag{Name: "gc-interval", Value: retention.DefaultInterval, Destination: &opts.GCInterval, Sources: env.Vars("GRADIENT_GC_INTERVAL"),
			Usage: "collect the binary cache's garbage this often (what no kept evaluation, pin, push or recent upload reaches); 0: only on demand (gradient cache gc)"},
		&servicecli.SecondsFlag{Name: "gc-grace", Value: retention.DefaultGrace, Destination: &opts.GCGrace, Sources: env.Vars("GRADIENT_GC_GRACE"),
			Usage: "never collect a path uploaded this recently (6h)"},
		&cli.IntFlag{Name: "keep-evaluations", Value: retention.DefaultKeep, Destination: &opts.KeepEvaluations, Sources: env.Vars("GRADIENT_KEEP_EVALUATIONS", "GRADIENT_EVAL_MAX_KEEP"),
			Validator: func(n int) error {
				if n < 1 {
					return fmt.Errorf("--keep-evaluations must be at least 1")
				}
				return nil
			},
			Usage: "keep this many of each project's newest evaluations (their outputs, closures and logs) unless the project sets its own"},
		&cli.StringFlag{Name: "external-url", Destination: &opts.ExternalURL, Sources: env.Vars("GRADIENT_EXTERNAL_URL"),
			Validator: validExternalURL,
			Usage:     "the server's address as forges and users reach it (https://ci.example.com): webhook URLs and the links of commit statuses"},
		&cli.BoolFlag{Name: "allow-local-repositories", Destination: &opts.AllowLocalRepositories, Sources: env.Vars("GRADIENT_ALLOW_LOCAL_REPOSITORIES"),
			Usage: "let projects use file:// URLs and local paths as repositories (off: a project cannot make the server read repositories on its disk)"},
		&cli.IntFlag{Name: "max-connections", Aliases: []string{"proto-max-connections"}, Value: 256, Destination: &opts.MaxConnections,
			Sources: env.Vars("GRADIENT_MAX_CONNECTIONS", "GRADIENT_PROTO_MAX_CONNECTIONS"), Validator: servicecli.Positive[int],
			Usage: "most /proto sessions at once (workers and cache clients); unauthenticated ones hold at most half, the rest is kept for sessions past the handshake; an upgrade gets HTTP 503 only when no unauthenticated session can be closed for it"},
		&cli.IntFlag{Name: "auth-failures-per-minute", Value: 30, Destination: &opts.AuthFailures, Sources: env.Vars("GRADIENT_AUTH_FAILURES_PER_MINUTE"),
			Validator: servicecli.NotNegative[int],
			Usage:     "wrong admin tokens and cache API keys one client address may send per minute; beyond them it gets HTTP 429 until it regains attempts at that rate (addresses as the connection shows them: behind a reverse proxy, the proxy's); 0 disables"},
		&cli.IntFlag{Name: "max-handshakes-per-ip", Value: 32, Destination: &opts.HandshakesPerIP, Sources: env.Vars("GRADIENT_MAX_HANDSHAKES_PER_IP"),
			Validator: servicecli.Positive[int],
			Usage:     "most worker connections per address prefix (IPv4 /24, IPv6 /64) that have not finished the handshake; past it, or past half of --max-connections for all of them, the oldest unauthenticated connection (of the prefix, else of the prefix holding the most) is closed to admit the new one; raise it for many workers behind one NAT address"},
		&cli.BoolFlag{Name: "proto-anonymous-cache-enable", Value: true, Destination: &opts.AnonymousCache,
			Sources: env.Vars("GRADIENT_PROTO_ANONYMOUS_CACHE_ENABLE"),
			Usage:   "let cache sessions read public caches without a cache API key; on by default, =false makes every cache session need a key"},
		&cli.IntFlag{Name: "proto-anonymous-cache-max-connections-per-ip", Value: 32, Destination: &opts.AnonymousCachePerIP,
			Sources: env.Vars("GRADIENT_PROTO_ANONYMOUS_CACHE_MAX_CONNECTIONS_PER_IP"), Validator: servicecli.Positive[int],
			Usage: "most anonymous cache sessions of one client IP at once"},
		&cli.Uint64Flag{Name: "build-default-timeout-secs", Value: scheduler.DefaultTimeoutSecs, Destination: &opts.BuildDefaultTimeoutSecs,
			Sources: env.Vars("GRADIENT_BUILD_DEFAULT_TIMEOUT_SECS"), Validator: fitsInt64,
			Usage: "wall-clock limit in seconds of a build whose derivation sets no timeout; 0 disables"},
		&cli.Uint64Flag{Name: "build-default-max-silent-secs", Value: scheduler.DefaultMaxSilentSecs, Destination: &opts.BuildDefaultMaxSilentSecs,
			Sources: env.Vars("GRADIENT_BUILD_DEFAULT_MAX_SILENT_SECS"), Validator: fitsInt64,
			Usage: "limit in seconds on a build's time without log output when its derivation sets no maxSilent; 0 disables"},
		&cli.IntFlag{Name: "build-max-attempts", Value: 3, Destination: &opts.BuildMaxAttempts,
			Sources: env.Vars("GRADIENT_BUILD_MAX_ATTEMPTS"), Validator: servicecli.Positive[int],
			Usage: "runs of a job that fails with a retryable kind (transient, timeout) before it fails for good"},
		&servicecli.SecondsFlag{Name: "build-retry-backoff-secs", Value: 30 * time.Second, Destination: &opts.BuildRetryBackoff,
			Sources: env.Vars("GRADIENT_BUILD_RETRY_BACKOFF_SECS"),
			Usage:   "seconds before a failed job's retry, doubling with each attempt; 0 retries at once"},
		&cli.BoolFlag{Name: "proto-federate", Destination: &opts.Federate, Sources: env.Vars("GRADIENT_PROTO_FEDERATE"),
			Usage: "offer the federate capability to workers that offer it too (reserved: negotiated only, no behaviour yet)"},
		&cli.BoolFlag{Name: "proto-discoverable", Value: true, Destination: &opts.Discoverable, Sources: env.Vars("GRADIENT_PROTO_DISCOVERABLE"),
			Usage: "dial the workers registered with a URL (needs --dial-key-file); =false keeps such registrations but never dials them, and only workers that connect themselves run"},
	}
	flags = append(flags,
		&cli.StringFlag{Name: "instance-id", Destination: &opts.InstanceID, Sources: env.Vars("GRADIENT_INSTANCE_ID"),
			Validator: validInstanceID,
			Usage:     "this server's ID among the instances sharing the database (letters, digits, '.', '_', '-'; at most 64); default: a random one per start"},
		&servicecli.SecondsFlag{Name: "instance-lease", Value: instance.DefaultLease, Destination: &opts.InstanceLease, Sources: env.Vars("GRADIENT_INSTANCE_LEASE"),
			Usage: "an instance that has not renewed its row for this long counts as dead to the others"},
		&servicecli.SecondsFlag{Name: "instance-renew", Value: instance.DefaultRenewEvery, Destination: &opts.InstanceRenew, Sources: env.Vars("GRADIENT_INSTANCE_RENEW"),
			Usage: "how often the instance renews its row (shorter than --instance-lease)"},
		&cli.BoolFlag{Name: "accept-config-change", Destination: &opts.AcceptConfigChange, Sources: env.Vars("GRADIENT_ACCEPT_CONFIG_CHANGE"),
			Usage: "on PostgreSQL, start although the dial key or NAR store differs from what the instances last ran with (refused still while a live instance disagrees)"},
	)
	flags = append(flags, servicecli.HTTPTimeoutFlags(&opts.HTTP, func(name string) cli.ValueSourceChain {
		return env.Vars("GRADIENT_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	})...)
	flags = append(flags, logging.Flags(env, "GRADIENT_")...)
	return &cli.Command{Name: "gradient-server", Usage: "the Gradient CI server", Description: description, Flags: flags}, tokens
}

// validInstanceID keeps instance IDs short and printable: they appear in
// logs, metrics labels and `gradient server status`.
func validInstanceID(id string) error {
	if id == "" {
		return nil
	}
	if len(id) > 64 {
		return errors.New("at most 64 characters")
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q is not a letter, digit, '.', '_' or '-'", r)
		}
	}
	return nil
}

// fitsInt64 keeps second counts within what the job loop stores.
func fitsInt64(n uint64) error {
	if n > 1<<63-1 {
		return errors.New("want seconds, or 0 to disable")
	}
	return nil
}

// parseOptions reads flags, then the environment for every flag not given.
// It returns servicecli.ErrHelp after -h and errUsage (explained on
// stderr) for a bad configuration.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var opts options
	var logging servicecli.Logging
	env := servicecli.NewEnv(getenv)
	cmd, tokens := command(&opts, env, &logging)
	err := servicecli.Parse(context.Background(), cmd, args, stderr, func() error {
		opts.LogLevel, opts.LogFormat = logging.Level(), logging.Format()
		var err error
		if opts.AdminToken, err = tokens.resolve(cmd, env); err != nil {
			return err
		}
		if opts.Listen == "" || opts.Database == "" {
			return errors.New("--listen and --database may not be empty")
		}
		return resolveS3(&opts, getenv)
	})
	if err != nil {
		return options{}, err
	}
	return opts, nil
}

func validNarStore(v string) error {
	if v == "local" || v == "s3" || strings.HasPrefix(v, "s3://") {
		return nil
	}
	return errors.New("want local, s3 or an s3:// URL")
}

// resolveS3 reads the URL form and the credentials of an S3 store.
func resolveS3(opts *options, getenv func(string) string) error {
	if opts.NarStore == "local" {
		return nil
	}
	if strings.HasPrefix(opts.NarStore, "s3://") {
		if err := opts.S3.ParseURL(opts.NarStore); err != nil {
			return err
		}
	}
	if opts.S3.Bucket == "" {
		return errors.New("--nar-store=s3 needs --s3-bucket (or an s3://BUCKET URL)")
	}
	if opts.S3CredentialsFile != "" {
		return opts.S3.LoadCredentialsFile(opts.S3CredentialsFile)
	}
	opts.S3.CredentialsFromEnv(getenv)
	if opts.S3.AccessKey == "" || opts.S3.SecretKey == "" {
		return errors.New("the S3 store needs --s3-credentials-file, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	return nil
}

// adminTokenFlags are --admin-token and --admin-token-file.
type adminTokenFlags struct {
	token, file *cli.StringFlag
}

// resolve picks the token from the command line, else from the
// environment; a token and a token file at the same level are ambiguous.
func (f *adminTokenFlags) resolve(cmd *cli.Command, env *servicecli.Env) (string, error) {
	token, file := cmd.String(f.token.Name), cmd.String(f.file.Name)
	tokenOnLine, fileOnLine := env.FromCommandLine(cmd, f.token), env.FromCommandLine(cmd, f.file)
	switch {
	case tokenOnLine && fileOnLine:
		return "", errors.New("give --admin-token or --admin-token-file, not both")
	case tokenOnLine:
		file = ""
	case fileOnLine:
		token = ""
	case token != "" && file != "":
		return "", errors.New("set GRADIENT_ADMIN_TOKEN or GRADIENT_ADMIN_TOKEN_FILE, not both")
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

// validExternalURL accepts an absolute http(s) URL without query or
// fragment ("" is unset).
func validExternalURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("--external-url %q: want an http(s) URL such as https://ci.example.com", s)
	}
	return nil
}
