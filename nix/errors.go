package nix

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// ErrCanceled is wrapped by every error caused by the caller's context
// ending (cancel or deadline); the Nix process was interrupted.
var ErrCanceled = errors.New("nix: canceled")

// CommandError is a Nix tool that exited unsuccessfully.
type CommandError struct {
	Args     []string
	ExitCode int    // -1 when the process did not exit normally
	Stderr   string // trimmed
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("nix: %s exited with status %d: %s", strings.Join(e.Args, " "), e.ExitCode, lastLines(e.Stderr, 10))
}

// TimeoutError is a build stopped by Nix's --timeout or --max-silent-time.
type TimeoutError struct {
	DrvPath string
	Silence bool   // true for max-silent-time, false for the wall clock
	Message string // Nix's error line
	LogTail string
}

func (e *TimeoutError) Error() string { return "nix: build timed out: " + e.Message }

// PermanentError is a builder that failed: retrying will not help.
type PermanentError struct {
	DrvPath string
	Message string // Nix's error lines
	LogTail string // the last lines of the build log
}

func (e *PermanentError) Error() string { return "nix: build failed: " + e.Message }

// InputsUnavailableError is a build whose inputs are not in the store and
// cannot be substituted or built here.
type InputsUnavailableError struct {
	DrvPath      string
	MissingPaths []string // store paths Nix named, when it named any
	Message      string
}

func (e *InputsUnavailableError) Error() string { return "nix: inputs unavailable: " + e.Message }

// TransientError is an infrastructure failure (out of memory, disk full,
// store trouble): worth retrying, perhaps elsewhere.
type TransientError struct {
	DrvPath string
	Message string
	LogTail string
}

func (e *TransientError) Error() string { return "nix: transient failure: " + e.Message }

// commandError turns a failed run into CommandError, or into ErrCanceled
// when the context ended first.
func commandError(ctx context.Context, cmd *exec.Cmd, err error, stderr string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %s: %w", ErrCanceled, cmd.Args[0], ctx.Err())
	}
	code := -1
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		return fmt.Errorf("nix: running %s: %w", strings.Join(cmd.Args, " "), err)
	}
	return &CommandError{Args: cmd.Args, ExitCode: code, Stderr: strings.TrimSpace(stderr)}
}

// errorLines keeps Nix's last "error: …" line and what follows it, which
// names the cause; before it is build log (which may say "error:" too).
func errorLines(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "error:") {
			return strings.Join(lines[i:], "\n")
		}
	}
	return lastLines(stderr, 5)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
