// Package nixexec runs Gradient jobs with Nix: the worker.Executor that
// fetches flakes, evaluates them into derivations and builds those, moving
// every path through the server's binary cache (docs/protocol/worker.md §6, §7).
//
// Nix sits behind the Store interface and the cache behind worker.Cache,
// so the protocol logic is unit-tested without either; the integration
// tests run real Nix against the real server.
package nixexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

// Store is what jobs need from Nix; *nix.Nix implements it (the store
// operations through the Nix daemon, evaluation with the Nix CLI).
type Store interface {
	FetchFlake(ctx context.Context, repoURL, commit string, opts nix.FetchOptions) (*nix.FetchedFlake, error)
	LockedInputPaths(ctx context.Context, flakeRef string) ([]string, error)
	// Evaluate finds a flake's derivations, calling found with each as
	// soon as it is found.
	Evaluate(ctx context.Context, flakeRef string, wildcards []string, opts nix.EvalOptions, found func(nix.FoundDerivation)) (*nix.Evaluation, error)
	Derivations(ctx context.Context, drvPaths ...string) (map[string]*nix.Derivation, error)
	PathInfo(ctx context.Context, paths ...string) ([]nix.PathInfo, error)
	ValidPaths(ctx context.Context, paths ...string) ([]string, error)
	DumpPath(ctx context.Context, path string, w io.Writer) error
	// ImportNAR adds a path from its zstd-compressed NAR, checked
	// against its metadata while it streams.
	ImportNAR(ctx context.Context, it nix.NarImport, zst io.Reader) error
	Build(ctx context.Context, drvPath string, opts nix.BuildOptions) (map[string]string, error)
	Substitute(ctx context.Context, paths ...string) error
	// AddIndirectRoot tells the store's garbage collector that link, a
	// symlink into the store, is a root while it exists.
	AddIndirectRoot(ctx context.Context, link string) error
}

var _ Store = (*nix.Nix)(nil)

// Executor runs flake and build jobs with a Nix store.
type Executor struct {
	Nix Store
	// Cores is passed to builds as --cores (0 = Nix's setting).
	Cores int
	// SSH is the ssh program for fetches with a deploy key ("" = ssh).
	SSH string
	// AllowLocalRepositories lets flake jobs fetch file:// URLs and local
	// paths (--allow-local-repositories); off, a project cannot make the
	// worker read repositories on its disk.
	AllowLocalRepositories bool
	// GCRootsDir holds the GC root links pinning what running jobs need
	// (docs/protocol/worker.md: /nix/var/nix/gcroots/gradient); "" pins nothing.
	GCRootsDir string
	// LogBurstPerMinute and LogSustainedPerHour bound the bytes of one
	// build's log sent to the server (0: 8 MiB and 64 MiB; negative: no
	// limit).
	LogBurstPerMinute   int64
	LogSustainedPerHour int64
	// EvalShards is how many Nix processes evaluate one flake, each over
	// a shard of its attributes (0: the CPU count, at most 4).
	EvalShards int
	// EvalMaxMemoryMiB bounds each evaluating process's memory: one past
	// it is replaced and the walk resumes where it was (0: no bound).
	EvalMaxMemoryMiB int
	// EvalBuildNice lowers the CPU priority of the builds that start
	// while this worker evaluates a flake by this much (nice; 0 off), so
	// builds streamed from the evaluation use the CPU it leaves
	// (docs/PERFORMANCE.md, issue 33). Only builds through daemon
	// children (a chroot store, or no system daemon socket) are
	// reniced: a system daemon's processes are not the worker's.
	EvalBuildNice int
	Logger        *slog.Logger
	// GC, when set, collects the store's garbage when its disk runs
	// short (storegc.go): no job starts while it collects, and each
	// job's end asks it to check the free space.
	GC *StoreGC

	evaluating atomic.Int32 // flake jobs in their EvaluateDerivations step
}

func (e *Executor) evalShards() int {
	if e.EvalShards > 0 {
		return e.EvalShards
	}
	return min(runtime.NumCPU(), 4)
}

var (
	_ worker.Executor    = (*Executor)(nil)
	_ worker.PathChecker = (*Executor)(nil)
)

// ValidPaths implements worker.PathChecker: candidates are scored by what
// the local store holds.
func (e *Executor) ValidPaths(ctx context.Context, paths ...string) ([]string, error) {
	return e.Nix.ValidPaths(ctx, paths...)
}

func (e *Executor) logBurst() int64     { return limitOr(e.LogBurstPerMinute, 8<<20) }
func (e *Executor) logSustained() int64 { return limitOr(e.LogSustainedPerHour, 64<<20) }

func limitOr(v, def int64) int64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func (e *Executor) logger() *slog.Logger {
	if e.Logger != nil {
		return e.Logger
	}
	return slog.Default()
}

// Run runs one job until it ends or ctx is cancelled.
func (e *Executor) Run(ctx context.Context, a worker.Assignment, r worker.Reporter) error {
	// No job starts while the store's garbage is collected.
	release, err := e.GC.hold(ctx)
	if err != nil {
		return err
	}
	release()
	j := &job{e: e, id: a.JobID, r: r, cache: r.Cache(), log: e.logger().With("job", a.JobID), sshKey: a.SSHKey,
		roots: &roots{dir: e.GCRootsDir, prefix: gcRootPrefix(a.JobID)}}
	defer e.GC.jobEnded() // after the links below are gone
	defer j.roots.release()
	switch spec := a.Job.(type) {
	case *wire.FlakeJob:
		err = j.runFlake(ctx, spec)
	case *wire.BuildJob:
		err = j.runBuilds(ctx, spec)
	default:
		err = worker.Fail(wire.FailurePermanent, fmt.Errorf("unknown job type %T", a.Job))
	}
	if err != nil && ctx.Err() != nil {
		// Cancelled (abort, stop, lost session): whatever failed on the
		// way is a consequence; the worker reports the cancel's cause.
		return ctx.Err()
	}
	return err
}

// job is one running job's context.
type job struct {
	e         *Executor
	roots     *roots
	sshKey    []byte // the project's deploy key, for fetches
	id        string
	r         worker.Reporter
	cache     worker.Cache
	log       *slog.Logger
	slotsOnce sync.Once
	slots     *uploadSlots
	// holdMu guards holds and unhold: the job's one hold on the
	// collector's gate, shared by its goroutines (see job.hold).
	holdMu sync.Mutex
	holds  int
	unhold func()
	// drvs are the derivations this job has read: a .drv is immutable,
	// and several builds of a job share inputs.
	drvs map[string]*nix.Derivation
}

// derivations reads paths' .drv files, each once per job.
func (j *job) derivations(ctx context.Context, paths ...string) (map[string]*nix.Derivation, error) {
	var unread []string
	for _, p := range paths {
		if j.drvs[p] == nil && !slices.Contains(unread, p) {
			unread = append(unread, p)
		}
	}
	if len(unread) > 0 {
		read, err := j.e.Nix.Derivations(ctx, unread...)
		if err != nil {
			return nil, err
		}
		if j.drvs == nil {
			j.drvs = make(map[string]*nix.Derivation, len(read))
		}
		for _, p := range unread {
			if read[p] == nil {
				return nil, fmt.Errorf("the store did not describe %s", p)
			}
			j.drvs[p] = read[p]
		}
	}
	out := make(map[string]*nix.Derivation, len(paths))
	for _, p := range paths {
		out[p] = j.drvs[p]
	}
	return out, nil
}

// classify turns a Nix failure into a job failure of the right kind.
func classify(err error) error {
	var (
		timeout   *nix.TimeoutError
		permanent *nix.PermanentError
		missing   *nix.InputsUnavailableError
		transient *nix.TransientError
		je        *worker.JobError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &je):
		return err
	case errors.As(err, &timeout):
		return worker.Fail(wire.FailureTimeout, err)
	case errors.As(err, &missing):
		return &worker.JobError{Kind: wire.FailureInputsUnavailable, MissingPaths: missing.MissingPaths, Err: err}
	case errors.As(err, &permanent):
		return worker.Fail(wire.FailurePermanent, err)
	case errors.As(err, &transient):
		return worker.Fail(wire.FailureTransient, err)
	}
	var unavailable *worker.NarUnavailableError
	if errors.As(err, &unavailable) {
		return &worker.JobError{Kind: wire.FailureInputsUnavailable, MissingPaths: unavailable.Paths, Err: err}
	}
	return err
}

// gcRootPrefix names a job's root links (job IDs are UUIDs or other
// printable IDs; anything path-like is replaced).
func gcRootPrefix(jobID string) string {
	b := []byte(jobID)
	for i, c := range b {
		if c == '/' || c == 0 || c == '.' {
			b[i] = '_'
		}
	}
	return string(b) + "-"
}
