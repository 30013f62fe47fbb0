package main

// gradient up: the quick start. One process runs an embedded server
// (SQLite and a NAR store in a data directory), the durable scheduler and
// N local workers that connect to it over loopback through the real
// protocol, evaluates one flake through fetch → eval → build, shows the
// progress and prints a summary table.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v3"

	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/metrics"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/nix/narsig"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

// upOptions are the flags of gradient up.
type upOptions struct {
	flake   string
	workers int
	dataDir string
	listen  string
	store   string
	serve   bool
	timeout time.Duration
	verbose bool
	poll    time.Duration
	// holdBuilds keeps the builds until the evaluation's end
	// (scheduler.Config.HoldStreamedBuilds): evaluation, then build.
	holdBuilds bool
	// evalBuildNice: nixexec.Executor.EvalBuildNice.
	evalBuildNice int
	// maxBuilds is each worker's build slots; evalShards and
	// evalMaxMemoryMiB are nixexec.Executor's (0: its defaults).
	maxBuilds, evalShards, evalMaxMemoryMiB int
	// cpuProfile is a file for the process's CPU profile (server and
	// workers, not Nix) from the evaluation's queueing to its end.
	cpuProfile string
	// wildcards are the patterns to build, checked; none: packages.<system>.*
	wildcards []string
}

// upTeam, upCache: the names gradient up gives what it creates.
const (
	upTeam  = "up"
	upCache = "up"
)

func (a *app) upCommand() *cli.Command {
	return &cli.Command{
		Name:  "up",
		Usage: "run a server and local workers, build FLAKE (default: the example flake)",
		Description: "Runs a server, local workers and one evaluation of FLAKE (a local git\n" +
			"directory or a git URL; default: the example flake shipped with Gradient),\n" +
			"building packages.<system>.* (or what --wildcards names) and printing a\n" +
			"summary. Exits 0 when every build succeeded. Progress and help go to stderr,\n" +
			"the summary to stdout.",
		ArgsUsage: "[FLAKE]",
		Metadata:  map[string]any{metaNoAdminFlags: true, metaHelpOnStderr: true},
		Before:    a.rejectAdminFlags,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "workers", Usage: "number of local workers", Value: 2, Sources: a.env("GRADIENT_UP_WORKERS")},
			&cli.StringFlag{Name: "data-dir", Usage: "`DIR` for the database, NARs and the example flake", TakesFile: true,
				DefaultText: "$XDG_DATA_HOME/gradient-up or ~/.local/share/gradient-up", Sources: a.env("GRADIENT_UP_DATA_DIR")},
			&cli.StringFlag{Name: "listen", Usage: "`ADDRESS` the server listens on", Value: "127.0.0.1:0", Sources: a.env("GRADIENT_UP_LISTEN")},
			&cli.StringFlag{Name: "store", Usage: "build in a chroot Nix store in this `DIR` instead of the default store", TakesFile: true, Sources: a.env("GRADIENT_UP_STORE")},
			&cli.BoolFlag{Name: "serve", Usage: "keep the server running afterwards and print the cache URL, its public key and the dashboard URL with a login token"},
			&cli.DurationFlag{Name: "timeout", Usage: "bound on the whole run", Value: 30 * time.Minute, Sources: a.env("GRADIENT_UP_TIMEOUT")},
			&cli.BoolFlag{Name: "verbose", Usage: "log the embedded server and workers at info level", Sources: a.env("GRADIENT_UP_VERBOSE")},
			&cli.BoolFlag{Name: "hold-builds", Usage: "start no build before the evaluation has discovered every derivation (evaluation, then build; by default builds start while it goes on)", Sources: a.env("GRADIENT_UP_HOLD_BUILDS")},
			&cli.IntFlag{Name: "eval-build-nice", Usage: "run builds that start while the worker evaluates this much `NICE`r (lower CPU priority; 0 off)", Value: 10, Sources: a.env("GRADIENT_UP_EVAL_BUILD_NICE")},
			&cli.IntFlag{Name: "build-max-concurrent", Usage: "build job slots of each local worker", Value: 1, Sources: a.env("GRADIENT_UP_BUILD_MAX_CONCURRENT")},
			&cli.IntFlag{Name: "eval-shards", Usage: "Nix processes evaluating the flake, each over a shard of its attributes; 0 uses the CPU count (at most 4)", Value: 0, Sources: a.env("GRADIENT_UP_EVAL_SHARDS")},
			&cli.IntFlag{Name: "eval-max-memory-mib", Usage: "resident memory (`MIB`) past which an evaluating Nix process is replaced, the walk resuming where it was; 0 is unbounded", Value: 0, Sources: a.env("GRADIENT_UP_EVAL_MAX_MEMORY_MIB")},
			&cli.StringFlag{Name: "cpu-profile", Usage: "write the CPU profile of this process (server and workers, not Nix) from the evaluation's queueing to its end into `FILE` (go tool pprof)", TakesFile: true, Sources: a.env("GRADIENT_UP_CPU_PROFILE")},
			&cli.StringFlag{Name: "wildcards", Usage: "comma-separated attribute `PATTERNS` to build, e.g. 'packages.*.*, checks.x86_64-linux.*'", DefaultText: "packages.<system>.*"},
		},
		Action: func(ctx context.Context, cmd *cli.Command) error {
			o, ok := a.upOptions(cmd)
			if !ok {
				return exitStatus(exitUsage)
			}
			return exitWith(a.up(ctx, o, a.stdout, a.stderr))
		},
	}
}

// upOptions checks gradient up's flags and its FLAKE, which may come
// before or after the flags.
func (a *app) upOptions(cmd *cli.Command) (upOptions, bool) {
	o := upOptions{
		workers: cmd.Int("workers"),
		dataDir: cmd.String("data-dir"),
		listen:  cmd.String("listen"),
		store:   cmd.String("store"),
		serve:   cmd.Bool("serve"),
		timeout: cmd.Duration("timeout"),
		verbose: cmd.Bool("verbose"),
		poll:    500 * time.Millisecond,

		holdBuilds: cmd.Bool("hold-builds"),
		cpuProfile: cmd.String("cpu-profile"),

		evalBuildNice:    cmd.Int("eval-build-nice"),
		maxBuilds:        cmd.Int("build-max-concurrent"),
		evalShards:       cmd.Int("eval-shards"),
		evalMaxMemoryMiB: cmd.Int("eval-max-memory-mib"),
	}
	positional := cmd.Args().Slice()
	switch {
	case len(positional) > 1:
		fmt.Fprintf(a.stderr, "gradient up: one FLAKE at most, got %q\n", positional)
		return o, false
	case len(positional) == 1:
		o.flake = positional[0]
	}
	if o.workers < 1 {
		fmt.Fprintln(a.stderr, "gradient up: --workers must be at least 1")
		return o, false
	}
	if o.evalBuildNice < 0 || o.evalBuildNice > 19 {
		fmt.Fprintln(a.stderr, "gradient up: --eval-build-nice must be between 0 and 19")
		return o, false
	}
	if o.maxBuilds < 1 {
		fmt.Fprintln(a.stderr, "gradient up: --build-max-concurrent must be at least 1")
		return o, false
	}
	if o.evalShards < 0 || o.evalMaxMemoryMiB < 0 {
		fmt.Fprintln(a.stderr, "gradient up: --eval-shards and --eval-max-memory-mib must not be negative")
		return o, false
	}
	if o.timeout <= 0 {
		fmt.Fprintln(a.stderr, "gradient up: --timeout must be positive")
		return o, false
	}
	if w := cmd.String("wildcards"); w != "" {
		list, err := admin.ParseWildcards([]string{w})
		if err != nil {
			fmt.Fprintf(a.stderr, "gradient up: --%v\n", err)
			return o, false
		}
		o.wildcards = list
	}
	return o, true
}

// parseUp parses gradient up's arguments (after "up") as the CLI does,
// without running anything.
func parseUp(args []string, stderr io.Writer) (upOptions, int, bool) {
	var parsed upOptions
	ran := false
	a := &app{ctx: context.Background(), getenv: os.Getenv, stdout: io.Discard, stderr: stderr,
		up: func(_ context.Context, o upOptions, _, _ io.Writer) int { parsed, ran = o, true; return exitOK }}
	code := a.run(append([]string{"up"}, args...))
	return parsed, code, ran
}

// runUpUntilSignal is gradient up in the terminal: Ctrl-C or SIGTERM
// stops it cleanly.
func runUpUntilSignal(ctx context.Context, o upOptions, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runUpOptions(ctx, o, stdout, stderr)
}

func upDefaultDataDir() (string, error) {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "gradient-up"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no --data-dir and no home directory: %w", err)
	}
	return filepath.Join(home, ".local", "share", "gradient-up"), nil
}

// upSyncWriter serializes the writes of the embedded components' loggers
// and the progress lines.
type upSyncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *upSyncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// runUpContext runs gradient up ARGS… under ctx, without signal handling.
func runUpContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{ctx: ctx, getenv: os.Getenv, stdout: stdout, stderr: stderr, up: runUpOptions}
	return a.run(append([]string{"up"}, args...))
}

// runUpOptions is one gradient up with checked options.
func runUpOptions(ctx context.Context, o upOptions, stdout, stderr io.Writer) int {
	errw := &upSyncWriter{w: stderr}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(errw, "gradient up: "+format+"\n", a...)
		return exitFail
	}
	for _, tool := range []string{"nix", "nix-store", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fail("%s is not installed; on Debian or Ubuntu: sudo apt-get install nix-bin git (scripts/up does it)", tool)
		}
	}
	if o.dataDir == "" {
		d, err := upDefaultDataDir()
		if err != nil {
			return fail("%v", err)
		}
		o.dataDir = d
	}
	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return fail("%v", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fail("data directory: %v", err)
	}

	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(upQuietLoopback{slog.NewTextHandler(errw, &slog.HandlerOptions{Level: level})})
	// Components without a logger of their own (storage.Open) use the
	// default; restore it, and the log package it redirects, afterwards.
	prevDefault, prevOut, prevFlags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(logger)
	defer func() {
		slog.SetDefault(prevDefault)
		log.SetOutput(prevOut)
		log.SetFlags(prevFlags)
	}()

	runCtx, cancelRun := context.WithTimeout(ctx, o.timeout)
	defer cancelRun()

	u := &upRun{opts: o, dataDir: dataDir, log: logger, stdout: stdout, stderr: errw, start: time.Now()}
	defer u.close()
	if err := u.setUp(runCtx); err != nil {
		if errors.Is(runCtx.Err(), context.DeadlineExceeded) {
			return fail("timed out after %s (--timeout) while starting: %v", o.timeout, err)
		}
		return fail("%v", err)
	}
	stopProfile, err := startUpProfile(o.cpuProfile)
	if err != nil {
		return fail("%v", err)
	}
	code := u.evaluate(runCtx)
	if err := stopProfile(); err != nil {
		return fail("%v", err)
	}
	if o.serve && ctx.Err() == nil {
		u.serve(ctx)
	}
	return code
}

// startUpProfile starts the CPU profile of --cpu-profile, if any; stop
// ends it and closes the file.
func startUpProfile(file string) (stop func() error, err error) {
	if file == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("--cpu-profile: %w", err)
		}
		return nil
	}, nil
}

// upQuietLoopback drops the warning about dialing without TLS: the workers
// of gradient up dial the server over loopback on purpose.
type upQuietLoopback struct{ slog.Handler }

func (q upQuietLoopback) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && r.Message == "dialing without TLS" {
		return nil
	}
	return q.Handler.Handle(ctx, r)
}

func (q upQuietLoopback) WithAttrs(attrs []slog.Attr) slog.Handler {
	return upQuietLoopback{q.Handler.WithAttrs(attrs)}
}

func (q upQuietLoopback) WithGroup(name string) slog.Handler {
	return upQuietLoopback{q.Handler.WithGroup(name)}
}

// upLevelFloor passes records at min or above.
type upLevelFloor struct {
	slog.Handler
	min slog.Level
}

func (l upLevelFloor) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= l.min && l.Handler.Enabled(ctx, level)
}

func (l upLevelFloor) WithAttrs(attrs []slog.Attr) slog.Handler {
	return upLevelFloor{l.Handler.WithAttrs(attrs), l.min}
}

func (l upLevelFloor) WithGroup(name string) slog.Handler {
	return upLevelFloor{l.Handler.WithGroup(name), l.min}
}

// upRun is one gradient up: what it started, in the order close stops it.
type upRun struct {
	opts    upOptions
	dataDir string
	log     *slog.Logger
	stdout  io.Writer
	stderr  *upSyncWriter
	start   time.Time

	db      *storage.DB
	queue   *jobqueue.Queue // progress and cancel of the evaluations
	sched   *scheduler.Scheduler
	srv     *server.Server
	httpSrv *http.Server
	addr    string
	cache   storage.Cache
	project storage.Project
	system  string

	repoURL, commit string
	workerNames     map[string]string // worker ID → worker-N

	stopWorkers context.CancelFunc
	nixStore    *nix.Nix // the workers' store, through its daemon
	workersDone sync.WaitGroup
}

func (u *upRun) progress(format string, a ...any) {
	fmt.Fprintf(u.stderr, "[%6.1fs] %s\n", time.Since(u.start).Seconds(), fmt.Sprintf(format, a...))
}

func (u *upRun) setUp(ctx context.Context) error {
	// The flake first: a bad FLAKE should fail before anything starts.
	flakeLabel, err := u.resolveFlake(ctx)
	if err != nil {
		return err
	}
	u.progress("flake %s at commit %s", flakeLabel, upShortID(u.commit))

	n, err := u.nix()
	if err != nil {
		return err
	}
	u.nixStore = n
	// Nix's settings (a nix process) while the database opens.
	var (
		system          string
		extra, features []string
		nixErr          error
	)
	asked := make(chan struct{})
	go func() {
		defer close(asked)
		if system, extra, nixErr = n.System(ctx); nixErr != nil {
			nixErr = fmt.Errorf("asking nix for its system: %w", nixErr)
			return
		}
		if features, nixErr = n.SystemFeatures(ctx); nixErr != nil {
			nixErr = fmt.Errorf("asking nix for its system features: %w", nixErr)
		}
	}()
	u.db, err = storage.Open(ctx, filepath.Join(u.dataDir, "db"))
	<-asked
	if err != nil {
		return err
	}
	u.queue = jobqueue.New(u.db)
	if nixErr != nil {
		return nixErr
	}
	u.system = system
	nars, err := narstore.OpenLocal(filepath.Join(u.dataDir, "nars"), u.log)
	if err != nil {
		return err
	}
	if err := u.prepareDatabase(ctx, flakeLabel); err != nil {
		return err
	}

	// One registry for the server, the job loop and the workers (each
	// worker's series labelled with its name), served at /metrics.
	reg := metrics.NewRegistry()
	u.sched = scheduler.New(u.db, scheduler.Config{Logger: u.log, Metrics: reg, Tick: time.Second, HoldStreamedBuilds: u.opts.holdBuilds})
	if err := u.sched.Start(ctx); err != nil {
		return fmt.Errorf("starting the scheduler: %w", err)
	}
	// up builds a flake from a local repository by design: its own server
	// and workers allow local repositories.
	u.srv = server.New(u.db, server.Config{NarStore: nars, Jobs: u.sched, Metrics: reg, Logger: u.log, AllowLocalRepositories: true})
	ln, err := net.Listen("tcp", u.opts.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", u.opts.listen, err)
	}
	u.addr = ln.Addr().String()
	u.httpSrv = httpguard.Server(u.srv.Handler(), httpguard.Timeouts{}, u.log)
	go u.httpSrv.Serve(ln)
	u.progress("server listening on http://%s (data in %s)", u.addr, u.dataDir)

	return u.startWorkers(ctx, n, append([]string{system}, extra...), features)
}

// prepareDatabase makes the team, cache and project (reusing them from an
// earlier run), cancels evaluations an interrupted run left open, and
// drops old worker registrations.
func (u *upRun) prepareDatabase(ctx context.Context, flakeLabel string) error {
	team, err := u.db.TeamByName(ctx, upTeam)
	if errors.Is(err, storage.ErrNotFound) {
		team, err = u.db.CreateTeam(ctx, upTeam)
	}
	if err != nil {
		return fmt.Errorf("team: %w", err)
	}
	u.cache, err = u.db.CacheByName(ctx, upCache)
	if errors.Is(err, storage.ErrNotFound) {
		u.cache, err = u.db.CreateCache(ctx, storage.NewCache{Name: upCache, Public: true})
	}
	if err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	// The project builds what this run builds; its evaluation takes them
	// from the project as every evaluation does.
	wildcards := u.opts.wildcards
	if len(wildcards) == 0 {
		wildcards = []string{"packages." + u.system + ".*"}
	}
	name := upProjectName(flakeLabel)
	u.project, err = u.db.ProjectByName(ctx, team.ID, name)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		u.project, err = u.db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: name, Repository: u.repoURL, Branch: "main", Wildcards: wildcards})
	case err == nil:
		if u.project.Repository != u.repoURL {
			err = u.db.UpdateProjectSource(ctx, u.project.ID, u.repoURL, u.project.Branch)
		}
		if err == nil && !slices.Equal(u.project.Wildcards, wildcards) {
			err = u.db.UpdateProjectWildcards(ctx, u.project.ID, wildcards)
		}
		if err == nil {
			u.project, err = u.db.Project(ctx, u.project.ID)
		}
	}
	if err != nil {
		return fmt.Errorf("project: %w", err)
	}
	if _, err := u.db.SubscribeProject(ctx, u.project.ID, u.cache.ID); err != nil {
		return fmt.Errorf("subscribing the project to the cache: %w", err)
	}

	projects, err := u.db.ListProjects(ctx)
	if err != nil {
		return err
	}
	for _, p := range projects {
		evals, err := u.queue.ListEvaluations(ctx, p.ID, 1000)
		if err != nil {
			return err
		}
		for _, ev := range evals {
			if !ev.Status.Terminal() {
				if _, err := u.queue.CancelEvaluation(ctx, ev.ID); err != nil {
					return fmt.Errorf("cancelling evaluation %s of an earlier run: %w", ev.ID, err)
				}
			}
		}
	}
	peer := storage.Peer{Kind: storage.PeerProject, ID: u.project.ID}
	regs, err := u.db.ListPeerRegistrations(ctx, peer)
	if err != nil {
		return err
	}
	for _, r := range regs {
		if err := u.db.DeleteRegistration(ctx, peer, r.WorkerID); err != nil {
			return fmt.Errorf("dropping an earlier run's worker: %w", err)
		}
	}
	return nil
}

// nix is the Nix the workers run: the default store, or a chroot store
// in --store configured to work offline without build users.
func (u *upRun) nix() (*nix.Nix, error) {
	nixDir := filepath.Join(u.dataDir, "nix")
	// Nix's own failure warnings repeat what the summary says; --verbose
	// shows them with the commands it runs.
	nixLog := u.log
	if !u.opts.verbose {
		nixLog = slog.New(upLevelFloor{u.log.Handler(), slog.LevelError})
	}
	n := &nix.Nix{WorkDir: filepath.Join(nixDir, "work"), Logger: nixLog}
	if err := os.MkdirAll(n.WorkDir, 0o700); err != nil {
		return nil, err
	}
	n.Config = []string{
		"experimental-features = nix-command flakes",
		"flake-registry =", // offline: no global registry download
	}
	if u.opts.store == "" {
		if os.Geteuid() == 0 {
			if _, err := user.LookupGroup("nixbld"); err != nil {
				n.Config = append(n.Config, "build-users-group =")
			}
		}
		return n, nil
	}
	store, err := filepath.Abs(u.opts.store)
	if err != nil {
		return nil, err
	}
	n.Store = store
	n.Config = append(n.Config,
		"substituters =",
		"sandbox = false",
		"build-users-group =",
		"sandbox-paths = /bin /lib /lib64 /usr",
	)
	for _, d := range []string{"etc", "home", "cache"} {
		if err := os.MkdirAll(filepath.Join(nixDir, d), 0o700); err != nil {
			return nil, err
		}
	}
	n.Env = []string{
		"NIX_CONF_DIR=" + filepath.Join(nixDir, "etc"),
		"NIX_USER_CONF_FILES=",
		"HOME=" + filepath.Join(nixDir, "home"),
		"XDG_CACHE_HOME=" + filepath.Join(nixDir, "cache"),
		"GIT_CONFIG_NOSYSTEM=1",
	}
	return n, nil
}

// upCPUCoreScore is what the local workers report as their core speed.
// They share one machine, and the score only ranks workers against each
// other: any equal value does, and measuring it (worker.CPUCoreScore)
// would spin a core for 100 ms at every start.
const upCPUCoreScore = 1

func (u *upRun) startWorkers(ctx context.Context, n *nix.Nix, archs, features []string) error {
	// The workers trust what their server's cache signs, as an operator
	// configures with --trusted-public-keys.
	keys, err := narsig.ParseKeys(u.cache.PublicKey())
	if err != nil {
		return fmt.Errorf("the cache's public key: %w", err)
	}
	n.TrustedKeys = keys
	wctx, cancel := context.WithCancel(context.Background())
	u.stopWorkers = cancel
	u.workerNames = map[string]string{}
	url := "ws://" + u.addr + "/proto"
	// The registrations at once: each hashes its token with argon2id.
	ids, tokens, errs := make([]string, u.opts.workers), make([]string, u.opts.workers), make([]error, u.opts.workers)
	var registered sync.WaitGroup
	for i := range ids {
		ids[i] = storage.NewID()
		registered.Go(func() {
			_, tokens[i], errs[i] = u.db.CreateRegistration(ctx, storage.Peer{Kind: storage.PeerProject, ID: u.project.ID}, ids[i], storage.DefaultWorkerSettings())
		})
	}
	registered.Wait()
	for i := 1; i <= u.opts.workers; i++ {
		id, token := ids[i-1], tokens[i-1]
		name := fmt.Sprintf("worker-%d", i)
		if err := errs[i-1]; err != nil {
			return fmt.Errorf("registering %s: %w", name, err)
		}
		tmp := filepath.Join(u.dataDir, "tmp", name)
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			return err
		}
		wlog := u.log.With("worker", name)
		w, err := worker.New(worker.Config{
			Session: workersession.Config{
				ServerURL: url, WorkerID: id, Peers: u.project.ID + ":" + token,
				Capabilities:   wire.GradientCapabilities{Fetch: true, Eval: true, Build: true},
				BackoffInitial: 100 * time.Millisecond, BackoffMax: 2 * time.Second,
				Logger:  wlog,
				Metrics: prometheus.WrapRegistererWith(prometheus.Labels{"worker": name}, u.srv.Metrics()),
			},
			Architectures:  archs,
			SystemFeatures: features,
			CPUCoreScore:   upCPUCoreScore,
			MaxBuilds:      u.opts.maxBuilds,
			Executor: &nixexec.Executor{Nix: n, Logger: wlog, AllowLocalRepositories: true, EvalBuildNice: u.opts.evalBuildNice,
				EvalShards: u.opts.evalShards, EvalMaxMemoryMiB: u.opts.evalMaxMemoryMiB},
			TempDir: tmp,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		u.workerNames[id] = name
		u.workersDone.Add(1)
		go func() {
			defer u.workersDone.Done()
			if err := w.Run(wctx); err != nil && wctx.Err() == nil {
				u.log.Error("worker stopped", "worker", name, "error", err)
			}
		}()
	}
	u.progress("started %d workers for %s", u.opts.workers, strings.Join(archs, ", "))
	return nil
}

// serve keeps the server up until ctx ends (Ctrl-C).
func (u *upRun) serve(ctx context.Context) {
	cacheURL := "http://" + u.addr + "/cache/" + u.cache.Name
	fmt.Fprintf(u.stdout, "\nserving the binary cache until interrupted (Ctrl-C):\n")
	fmt.Fprintf(u.stdout, "  cache URL:  %s\n", cacheURL)
	fmt.Fprintf(u.stdout, "  public key: %s\n", u.cache.PublicKey())
	fmt.Fprintf(u.stdout, "  use it:     nix --extra-experimental-features nix-command copy --from '%s' --option trusted-public-keys '%s' OUTPUT-PATH\n", cacheURL, u.cache.PublicKey())
	revoke := u.printDashboard(ctx)
	<-ctx.Done()
	revoke()
	fmt.Fprintln(u.stderr, "gradient up: stopping")
}

// printDashboard prints the dashboard's URL with an admin-scoped API
// token to log in with, valid while this run serves: revoke ends it.
func (u *upRun) printDashboard(ctx context.Context) (revoke func()) {
	tok, text, err := u.db.CreateAPIToken(ctx, "gradient up --serve", storage.ScopeAdmin)
	if err != nil {
		fmt.Fprintf(u.stderr, "gradient up: no dashboard login: %v\n", err)
		fmt.Fprintf(u.stdout, "  dashboard:  http://%s/\n", u.addr)
		return func() {}
	}
	revoke = func() {
		bg, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := u.db.DeleteAPIToken(bg, tok.ID); err != nil {
			fmt.Fprintf(u.stderr, "gradient up: revoking the dashboard token: %v\n", err)
		}
	}
	fmt.Fprintf(u.stdout, "  dashboard:  http://%s/ (log in with %s, valid until this run stops)\n", u.addr, text)
	return revoke
}

// close stops what setUp started, workers first so their sessions end
// cleanly.
func (u *upRun) close() {
	if u.stopWorkers != nil {
		u.stopWorkers()
		done := make(chan struct{})
		go func() { u.workersDone.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			fmt.Fprintln(u.stderr, "gradient up: workers did not stop within 20s")
		}
	}
	if u.nixStore != nil {
		u.nixStore.Close() // the nix-daemon children of a --store run
	}
	if u.srv != nil {
		u.srv.Close()
	}
	if u.httpSrv != nil {
		u.httpSrv.Close()
	}
	if u.sched != nil {
		u.sched.Close()
	}
	if u.db != nil {
		u.db.Close()
	}
}
