package nix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// BuildOptions limit and observe one build.
type BuildOptions struct {
	Timeout   time.Duration // wall clock (Nix --timeout); 0 = none
	MaxSilent time.Duration // without log output (--max-silent-time); 0 = none
	Cores     int           // --cores; 0 = Nix's setting
	// LogWriter receives Nix's stderr (builder output and progress) as it
	// is produced; nil discards it.
	LogWriter io.Writer
}

// logTailBytes is how much of the end of the log errors carry.
const logTailBytes = 8 << 10

// Exit statuses of `nix-store --realise` (tested 2.8).
const (
	exitBuildFailed = 100
	exitTimedOut    = 101
)

// Build realises drvPath without substitutes (`nix-store --realise`) and
// returns its outputs by name. Failures are *TimeoutError, *PermanentError,
// *InputsUnavailableError, *TransientError, or wrap ErrCanceled.
func (n *Nix) Build(ctx context.Context, drvPath string, opts BuildOptions) (map[string]string, error) {
	args := []string{"--realise", drvPath, "--option", "substitute", "false"}
	if opts.Timeout > 0 {
		args = append(args, "--timeout", seconds(opts.Timeout))
	}
	if opts.MaxSilent > 0 {
		args = append(args, "--max-silent-time", seconds(opts.MaxSilent))
	}
	if opts.Cores > 0 {
		args = append(args, "--cores", strconv.Itoa(opts.Cores))
	}
	log := n.logger().With("drv", drvPath)
	log.Info("nix: building", "timeout", opts.Timeout, "maxSilent", opts.MaxSilent)
	start := time.Now()

	cmd := n.command(ctx, "nix-store", args...)
	tail := &tailBuffer{max: logTailBytes}
	var stderr io.Writer = tail
	if opts.LogWriter != nil {
		stderr = io.MultiWriter(tail, opts.LogWriter)
	}
	cmd.Stderr = stderr
	cmd.Stdout = io.Discard // the output paths; read from the .drv instead
	runErr := cmd.Run()
	if runErr != nil {
		err := classifyBuildFailure(ctx, cmd, drvPath, runErr, tail.String())
		log.Warn("nix: build failed", "took", time.Since(start), "err", err)
		return nil, err
	}

	drv, err := n.Derivation(ctx, drvPath)
	if err != nil {
		return nil, fmt.Errorf("nix: reading outputs of %s: %w", drvPath, err)
	}
	outputs := drv.OutputPaths()
	if len(outputs) == 0 {
		return nil, &PermanentError{DrvPath: drvPath, Message: "build reported success but produced no recordable outputs"}
	}
	log.Info("nix: built", "took", time.Since(start), "outputs", len(outputs))
	return outputs, nil
}

func seconds(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

var (
	// Nix names missing inputs in these messages when it cannot substitute.
	missingInputPatterns = []string{"cannot build missing derivation", "don't know how to build these paths", "is not valid", "does not exist in the store", "required, but there is no substituter"}
	// Infrastructure signatures (JOBS.md §10): retrying may help.
	transientPatterns = []string{"out of memory", "cannot allocate memory", "oom-killer", "no space left on device", "cannot connect to daemon", "unexpected end-of-file", "input/output error", "connection reset by peer", "broken pipe"}
	storePathRE       = regexp.MustCompile(`/nix/store/[0-9a-z]{32}-[^\s'"]+`)
)

// classifyBuildFailure maps a failed nix-store run to a typed error.
func classifyBuildFailure(ctx context.Context, cmd *exec.Cmd, drvPath string, runErr error, log string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: build of %s: %w", ErrCanceled, drvPath, ctx.Err())
	}
	message := errorLines(log)
	var exit *exec.ExitError
	if !errors.As(runErr, &exit) {
		return &TransientError{DrvPath: drvPath, Message: runErr.Error(), LogTail: log}
	}
	lower := strings.ToLower(message)
	switch {
	case exit.ExitCode() == exitTimedOut || strings.Contains(lower, "timed out after"):
		return &TimeoutError{DrvPath: drvPath, Silence: strings.Contains(lower, "of silence"), Message: message, LogTail: log}
	case containsAny(lower, transientPatterns):
		return &TransientError{DrvPath: drvPath, Message: message, LogTail: log}
	case containsAny(lower, missingInputPatterns):
		missing := storePathRE.FindAllString(message, -1)
		return &InputsUnavailableError{DrvPath: drvPath, MissingPaths: slices.Compact(missing), Message: message}
	case exit.ExitCode() == exitBuildFailed:
		return &PermanentError{DrvPath: drvPath, Message: message, LogTail: log}
	}
	// Any other status is Nix itself failing, not the builder.
	return &TransientError{DrvPath: drvPath, Message: fmt.Sprintf("nix-store exited with status %d: %s", exit.ExitCode(), message), LogTail: log}
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

// Substitute fetches paths from the substituters Nix is configured with
// (`nix-store --realise` of output paths with substitution on): it never
// builds, so a path no substituter has is an error naming it.
func (n *Nix) Substitute(ctx context.Context, paths ...string) error {
	if len(paths) == 0 {
		return nil
	}
	n.logger().Info("nix: substituting", "paths", len(paths))
	_, err := n.output(ctx, "nix-store", append([]string{"--realise", "--option", "substitute", "true"}, paths...)...)
	if err != nil {
		return fmt.Errorf("nix: substituting %d path(s): %w", len(paths), err)
	}
	return nil
}
