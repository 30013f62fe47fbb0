package nix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/nix/daemon"
)

// BuildOptions limit and observe one build.
type BuildOptions struct {
	Timeout   time.Duration // wall clock (Nix --timeout); 0 = none
	MaxSilent time.Duration // without log output (--max-silent-time); 0 = none
	Cores     int           // --cores; 0 = Nix's setting
	// LogWriter receives Nix's stderr (builder output and progress) as it
	// is produced; nil discards it.
	LogWriter io.Writer
	// Nice runs the build this much nicer (lower CPU priority) than this
	// process, through daemon children of its own (only when the store's
	// daemon is this process's child: a Store, or no system daemon); 0:
	// as every other operation.
	Nice int
}

// logTailBytes is how much of the end of the log errors carry.
const logTailBytes = 8 << 10

// Build realises drvPath's outputs through the daemon without
// substitutes, with opts' limits, and returns its outputs by name.
// Failures are *TimeoutError, *PermanentError, *InputsUnavailableError,
// *TransientError, or wrap ErrCanceled.
func (n *Nix) Build(ctx context.Context, drvPath string, opts BuildOptions) (map[string]string, error) {
	log := n.logger().With("drv", drvPath)
	log.Debug("nix: building", "timeout", opts.Timeout, "maxSilent", opts.MaxSilent)
	start := time.Now()
	tail := &tailBuffer{max: logTailBytes}
	var out io.Writer = tail
	if opts.LogWriter != nil {
		out = io.MultiWriter(tail, opts.LogWriter)
	}
	lineLog := &daemon.Logger{
		Line: func(line string) { io.WriteString(out, line+"\n") },
		Start: func(a daemon.Activity) {
			// What `nix-store --realise` printed before the builder's output.
			if a.Type == daemon.ActivityBuild && a.Text != "" {
				io.WriteString(out, a.Text+"...\n")
			}
		},
	}
	results, err := n.longOpClient(opts.Nice).BuildPaths(ctx, []string{drvPath + "!*"},
		daemon.BuildOptions{Timeout: opts.Timeout, MaxSilent: opts.MaxSilent, Cores: opts.Cores, Log: lineLog})
	if err == nil && len(results) != 1 {
		err = fmt.Errorf("%w: %d results for one path", daemon.ErrProtocol, len(results))
	}
	if err != nil {
		err = classifyDaemonFailure(ctx, drvPath, err, tail.String())
		log.Warn("nix: build failed", "took", time.Since(start), "err", err)
		return nil, err
	}
	res := results[0]
	if !res.Success() {
		err := classifyBuildResult(drvPath, res, tail.String())
		log.Warn("nix: build failed", "took", time.Since(start), "err", err)
		return nil, err
	}
	outputs := res.Outputs
	if len(outputs) == 0 {
		// A daemon may leave them out for outputs that were valid already.
		drv, err := n.Derivation(ctx, drvPath)
		if err != nil {
			return nil, fmt.Errorf("nix: reading outputs of %s: %w", drvPath, err)
		}
		outputs = drv.OutputPaths()
	}
	if len(outputs) == 0 {
		return nil, &PermanentError{DrvPath: drvPath, Message: "build reported success but produced no recordable outputs"}
	}
	log.Debug("nix: built", "took", time.Since(start), "outputs", len(outputs))
	return outputs, nil
}

var (
	// Nix names missing inputs in these messages when it cannot substitute.
	missingInputPatterns = []string{"cannot build missing derivation", "don't know how to build these paths", "is not valid", "does not exist in the store", "required, but there is no substituter"}
	// Infrastructure signatures (docs/protocol/jobs.md §10): retrying may help. "killed"
	// is the reference's OOM signature: Nix's "failed due to signal 9
	// (Killed)" for a builder the kernel's OOM killer ended, or a shell's
	// "Killed" for a child it ended, among the log lines Nix quotes (a log
	// line of the builder's own saying "killed" is retried too, at most
	// build.maxAttempts times, as in the reference).
	transientPatterns = []string{"out of memory", "cannot allocate memory", "oom-killer", "killed", "no space left on device", "cannot connect to daemon", "unexpected end-of-file", "input/output error", "connection reset by peer", "broken pipe", "interrupted by the user"}
	storePathRE       = regexp.MustCompile(`/nix/store/[0-9a-z]{32}-[^\s'"]+`)
)

// classifyBuildResult maps a failed build's status to a typed error,
// with Nix's own message.
func classifyBuildResult(drvPath string, res daemon.BuildResult, log string) error {
	message := res.ErrorMsg
	lower := strings.ToLower(message)
	switch {
	case res.Status == daemon.StatusTimedOut:
		return &TimeoutError{DrvPath: drvPath, Silence: strings.Contains(lower, "of silence"), Message: message, LogTail: log}
	case containsAny(lower, transientPatterns):
		return &TransientError{DrvPath: drvPath, Message: message, LogTail: log}
	case containsAny(lower, missingInputPatterns):
		missing := storePathRE.FindAllString(message, -1)
		return &InputsUnavailableError{DrvPath: drvPath, MissingPaths: slices.Compact(missing), Message: message}
	}
	switch res.Status {
	case daemon.StatusPermanentFailure, daemon.StatusInputRejected, daemon.StatusOutputRejected, daemon.StatusCachedFailure,
		daemon.StatusDependencyFailed, daemon.StatusLogLimitExceeded, daemon.StatusNotDeterministic:
		return &PermanentError{DrvPath: drvPath, Message: message, LogTail: log}
	}
	// TransientFailure, MiscFailure and anything newer: Nix itself
	// failing, not the builder.
	return &TransientError{DrvPath: drvPath, Message: fmt.Sprintf("build status %d: %s", res.Status, message), LogTail: log}
}

// classifyDaemonFailure maps a failed BuildPaths call (not a failed
// build): the daemon refusing the request or going away.
func classifyDaemonFailure(ctx context.Context, drvPath string, err error, log string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: build of %s: %w", ErrCanceled, drvPath, ctx.Err())
	}
	var de *daemon.Error
	if errors.As(err, &de) {
		return classifyBuildResult(drvPath, daemon.BuildResult{Status: daemon.StatusMiscFailure, ErrorMsg: de.Error()}, log)
	}
	return &TransientError{DrvPath: drvPath, Message: err.Error(), LogTail: log}
}

func containsAny(s string, substrings []string) bool {
	for _, sub := range substrings {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// Substitute fetches paths from the substituters the daemon is
// configured with: it never builds, so a path no substituter has is an
// error naming it.
func (n *Nix) Substitute(ctx context.Context, paths ...string) error {
	if len(paths) == 0 {
		return nil
	}
	n.logger().Info("nix: substituting", "paths", len(paths))
	// A long operation, as a build is (longOpConns).
	results, err := n.longOpClient(0).BuildPaths(ctx, paths, daemon.BuildOptions{Substitute: true})
	if err != nil {
		return fmt.Errorf("nix: substituting %d path(s): %w", len(paths), daemonError(ctx, err))
	}
	for _, res := range results {
		if !res.Success() {
			return fmt.Errorf("nix: substituting %s: %s", res.Path, res.ErrorMsg)
		}
	}
	return nil
}
