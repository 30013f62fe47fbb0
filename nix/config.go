package nix

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gradient.dev/gradient/nix/daemon"
	"gradient.dev/gradient/nix/narsig"
)

// experimentalFeatures is passed to every `nix` call: in Nix 2.8 the new CLI
// and flakes are experimental and refuse to run without it.
const experimentalFeatures = "nix-command flakes"

// Nix runs the Nix command-line tools against one store with one
// configuration. The zero value uses the default store, the PATH and the
// ambient configuration.
type Nix struct {
	// Store is passed as --store (e.g. a chroot store directory); empty means
	// the default store (local, or the daemon when not root).
	Store string
	// Config lines are joined into NIX_CONFIG for every call.
	Config []string
	// Env is added to the process environment (KEY=VALUE), after os.Environ
	// without the worker's own settings (see environ).
	Env []string
	// BinDir holds nix, nix-store and git; empty looks them up in PATH.
	BinDir string
	// WorkDir holds temporary clones; empty means os.TempDir().
	WorkDir string
	// Logger receives what is being run; nil means slog.Default().
	Logger *slog.Logger

	// Dialer reaches the store's daemon; nil means the system daemon's
	// socket for the default store when it listens, else a `nix-daemon
	// --stdio` child per connection (see daemonClient).
	Dialer daemon.Dialer

	// TrustedKeys vouch for the input-addressed paths ImportNAR adds,
	// beside the keys of Nix's own trusted-public-keys setting; nil
	// trusts only those (see ImportNAR).
	TrustedKeys *narsig.Keys
	// ImportUnsigned lets ImportNAR add input-addressed paths no trusted
	// key signed: only for a store that is a trust domain of its own
	// (docs/SECURITY.md). Content-addressed paths are checked either way.
	ImportUnsigned bool

	version    versionCache  // see Version
	settings   settingsCache // see showConfig
	daemonOnce sync.Once
	daemon     *daemon.Client
	// longOnce, longDaemon: the pool of long operations (longOpClient).
	longOnce   sync.Once
	longDaemon atomic.Pointer[daemon.Client]
	// lowOnce, lowDaemon: the pool of BuildOptions.Nice builds.
	lowOnce    sync.Once
	lowDaemon  atomic.Pointer[daemon.Client]
	hookOnce   sync.Once // see buildHook
	hookPath   string
	configKeys configKeysCache // see trustedKeys
}

func (n *Nix) logger() *slog.Logger {
	if n.Logger != nil {
		return n.Logger
	}
	return slog.Default()
}

func (n *Nix) program(name string) string {
	if n.BinDir != "" {
		return filepath.Join(n.BinDir, name)
	}
	return name
}

// command prepares a Nix tool invocation with the store, features and
// environment of n. Flags go after the arguments: Nix parses them anywhere.
func (n *Nix) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	switch name {
	case "nix":
		args = append(args, "--extra-experimental-features", experimentalFeatures)
		fallthrough
	case "nix-store", "nix-instantiate":
		if n.Store != "" {
			args = append(args, "--store", n.Store)
		}
	}
	cmd := exec.CommandContext(ctx, n.program(name), args...)
	cmd.Env = n.environ()
	if extra, ok := ctx.Value(envKey{}).([]string); ok {
		cmd.Env = append(cmd.Env, extra...)
	}
	// Interrupt rather than kill: Nix then stops its builders and releases
	// locks; the kill after WaitDelay covers a hung process.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// environ is the environment of every Nix tool the worker runs: its own
// minus the GRADIENT_ variables, which carry the worker's settings and
// secrets (GRADIENT_WORKER_PEERS holds its tokens on Hetzner VMs).
// Evaluations run with --impure, so builtins.getEnv in a tenant's flake
// would read them otherwise.
func (n *Nix) environ() []string {
	env := withoutWorkerSettings(os.Environ())
	env = append(env, n.Env...)
	if len(n.Config) > 0 {
		env = append(env, "NIX_CONFIG="+strings.Join(n.Config, "\n"))
	}
	return env
}

// withoutWorkerSettings drops the GRADIENT_ variables from env.
func withoutWorkerSettings(env []string) []string {
	kept := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "GRADIENT_") {
			kept = append(kept, kv)
		}
	}
	return kept
}

// output runs a tool and returns its stdout; a failure carries stderr.
func (n *Nix) output(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := n.command(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	n.logger().Debug("nix: ran", "cmd", cmd.Args, "took", time.Since(start), "err", err)
	if err != nil {
		return stdout.Bytes(), commandError(ctx, cmd, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// outputJSON runs a tool and decodes its stdout into v.
func (n *Nix) outputJSON(ctx context.Context, v any, name string, args ...string) error {
	out, err := n.output(ctx, name, args...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("nix: decoding output of %s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// showConfig returns the effective settings, read once per Nix (see
// settingsCache). Nix 2.20 renamed `nix
// show-config` to `nix config show` (the old name later went away); both
// print `name = value` lines, which parseConfig reads. Takes
// settings.mu, held across the run, and under it version.mu (Version).
func (n *Nix) showConfig(ctx context.Context) (map[string]string, error) {
	n.settings.mu.Lock()
	defer n.settings.mu.Unlock()
	if n.settings.m != nil {
		return n.settings.m, nil
	}
	v, err := n.Version(ctx)
	if err != nil {
		return nil, err
	}
	args := []string{"show-config"}
	if v.AtLeast(versionConfigShow.Major, versionConfigShow.Minor) {
		args = []string{"config", "show"}
	}
	out, err := n.output(ctx, "nix", args...)
	if err != nil {
		return nil, err
	}
	n.settings.m = parseConfig(out)
	return n.settings.m, nil
}

// settingsCache remembers the first successful `nix config show` of a
// Nix (System and SystemFeatures read the same settings); like Version, a
// failure is not cached, and Config and Env are read by that first call.
type settingsCache struct {
	mu sync.Mutex
	m  map[string]string
}

// parseConfig reads `name = value` lines (lists are space-separated in the
// value); other lines, such as warnings, are skipped.
func parseConfig(out []byte) map[string]string {
	settings := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		name, value, ok := strings.Cut(line, " = ")
		if !ok {
			// An empty value prints as "name = " or, trimmed, "name =".
			name, ok = strings.CutSuffix(strings.TrimRight(line, " "), " =")
			value = ""
		}
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			continue
		}
		settings[name] = strings.TrimSpace(value)
	}
	return settings
}

// System returns the platform this Nix builds for natively (e.g.
// "x86_64-linux") and the extra platforms it can also build.
func (n *Nix) System(ctx context.Context) (system string, extraPlatforms []string, err error) {
	settings, err := n.showConfig(ctx)
	if err != nil {
		return "", nil, err
	}
	system, ok := settings["system"]
	if !ok || system == "" {
		return "", nil, fmt.Errorf("nix: the configuration has no system setting")
	}
	return system, strings.Fields(settings["extra-platforms"]), nil
}

// SystemFeatures returns the `system-features` setting (e.g. kvm,
// big-parallel): what derivations may require in requiredSystemFeatures.
func (n *Nix) SystemFeatures(ctx context.Context) ([]string, error) {
	settings, err := n.showConfig(ctx)
	if err != nil {
		return nil, err
	}
	features, ok := settings["system-features"]
	if !ok {
		return nil, fmt.Errorf("nix: the configuration has no system-features setting")
	}
	return strings.Fields(features), nil
}
