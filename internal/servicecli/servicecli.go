// Package servicecli holds what gradient-server, gradient-worker and
// gradient-proxy share on top of urfave/cli: flags bound to environment
// variables read through a lookup function (the process's, or a test's
// map), durations that also take plain seconds, the logging flags, and
// one way to report a bad configuration. Precedence is the library's: a
// flag on the command line wins over its variables, the first set
// variable listed wins over the later ones, and any variable over the
// default.
package servicecli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
)

// ErrUsage is a configuration error already explained on stderr.
var ErrUsage = errors.New("usage error")

// ErrHelp means -h was asked for and the help was written; nothing runs.
var ErrHelp = errors.New("help requested")

// Env binds flags to environment variables read through getenv. An empty
// variable counts as unset, as systemd units and NixOS modules write
// unset options. Env remembers which variables gave a value, so a caller
// can tell a flag typed on the command line from one set by a variable.
type Env struct {
	getenv func(string) string
	used   map[string]bool
}

// NewEnv reads variables through getenv (os.Getenv in the binaries).
func NewEnv(getenv func(string) string) *Env {
	return &Env{getenv: getenv, used: map[string]bool{}}
}

// Vars is the value source of a flag: the first of keys that is set.
func (e *Env) Vars(keys ...string) cli.ValueSourceChain {
	chain := cli.ValueSourceChain{}
	for _, k := range keys {
		chain.Chain = append(chain.Chain, &envSource{env: e, key: k})
	}
	return chain
}

// FromCommandLine reports whether flag f got its value from the command
// line rather than from one of its variables or its default.
func (e *Env) FromCommandLine(cmd *cli.Command, f cli.Flag) bool {
	if !cmd.IsSet(f.Names()[0]) {
		return false
	}
	if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
		for _, k := range ev.GetEnvVars() {
			if e.used[k] {
				return false
			}
		}
	}
	return true
}

// envSource is one variable; it satisfies cli.EnvValueSource so the help
// lists it beside its flag.
type envSource struct {
	env *Env
	key string
}

func (s *envSource) Lookup() (string, bool) {
	v := s.env.getenv(s.key)
	if v == "" {
		return "", false
	}
	s.env.used[s.key] = true
	return v, true
}

func (s *envSource) IsFromEnv() bool  { return true }
func (s *envSource) Key() string      { return s.key }
func (s *envSource) String() string   { return fmt.Sprintf("environment variable %q", s.key) }
func (s *envSource) GoString() string { return fmt.Sprintf("&envSource{key:%q}", s.key) }

// SecondsFlag is a duration that also takes plain seconds ("120" as well
// as "2m"), as the reference's *_SECS variables are written; negative
// durations are refused.
type SecondsFlag = cli.FlagBase[time.Duration, cli.NoConfig, secondsValue]

type secondsValue time.Duration

func (secondsValue) Create(val time.Duration, p *time.Duration, _ cli.NoConfig) cli.Value {
	*p = val
	return (*secondsValue)(p)
}

func (secondsValue) ToString(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}

func (v *secondsValue) Set(s string) error {
	d, err := ParseSeconds(s)
	if err != nil {
		return err
	}
	*v = secondsValue(d)
	return nil
}

func (v *secondsValue) Get() any       { return time.Duration(*v) }
func (v *secondsValue) String() string { return secondsValue(0).ToString(time.Duration(*v)) }

// ParseSeconds reads a Go duration ("90s", "2m") or plain seconds ("120").
func ParseSeconds(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 && n <= int64(time.Duration(1<<63-1)/time.Second) {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("want a duration such as 120s, or 0 to disable")
	}
	return d, nil
}

// Positive refuses numbers below 1.
func Positive[N int | int64](n N) error {
	if n < 1 {
		return errors.New("want a positive number")
	}
	return nil
}

// NotNegative refuses numbers below 0.
func NotNegative[N int | int64](n N) error {
	if n < 0 {
		return errors.New("want a number ≥ 0")
	}
	return nil
}

// Logging is the --log-level and --log-format pair of a service.
type Logging struct {
	level, format string
}

// Flags are the two logging flags, bound to prefix+"LOG_LEVEL" and
// prefix+"LOG_FORMAT".
func (l *Logging) Flags(env *Env, prefix string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error", Destination: &l.level,
			Sources: env.Vars(prefix + "LOG_LEVEL"), Validator: func(s string) error {
				var lv slog.Level
				if lv.UnmarshalText([]byte(s)) != nil {
					return errors.New("want debug, info, warn or error")
				}
				return nil
			}},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json", Destination: &l.format,
			Sources: env.Vars(prefix + "LOG_FORMAT"), Validator: func(s string) error {
				if s != "text" && s != "json" {
					return errors.New("want text or json")
				}
				return nil
			}},
	}
}

// Level is the parsed --log-level (the flag's validator checked it).
func (l *Logging) Level() slog.Level {
	var lv slog.Level
	lv.UnmarshalText([]byte(l.level))
	return lv
}

// Format is "text" or "json".
func (l *Logging) Format() string { return l.format }

// NewLogger is a service's structured logger: text or JSON on w.
func NewLogger(level slog.Level, format string, w io.Writer) *slog.Logger {
	h := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, h))
	}
	return slog.New(slog.NewTextHandler(w, h))
}

// Parse runs cmd's flag parsing on args (without the program name), help
// and errors on stderr. It returns ErrHelp after -h, ErrUsage after
// writing what is wrong (naming the flag, and the variable if the value
// came from one); then check, if set, validates across flags. Positional
// arguments are refused: the services take none.
func Parse(ctx context.Context, cmd *cli.Command, args []string, stderr io.Writer, check func() error) error {
	parsed := false
	cmd.Writer, cmd.ErrWriter = stderr, stderr
	cmd.HideHelpCommand = true
	cmd.OnUsageError = func(_ context.Context, _ *cli.Command, err error, _ bool) error { return err }
	cmd.ExitErrHandler = func(context.Context, *cli.Command, error) {}
	cmd.Action = func(_ context.Context, c *cli.Command) error {
		if c.Args().Present() {
			return unexpectedArgument(c, args, c.Args().First())
		}
		parsed = true
		return absolutePaths(c)
	}
	err := cmd.Run(ctx, append([]string{cmd.Name}, args...))
	if err == nil && !parsed {
		return ErrHelp
	}
	if err == nil && check != nil {
		err = check()
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd.Name, err)
		return ErrUsage
	}
	return nil
}

// absolutePaths makes the value of every path flag (a string flag that
// TakesFile) absolute, against the directory the service started in: a
// relative path handed on to git or Nix, or read after a chdir, means
// something else there (git+file://worker-state/… names a host). Empty
// values (a path left unset) and URLs (a flag taking a path or a
// postgres:// URL) stay as they are.
func absolutePaths(cmd *cli.Command) error {
	for _, f := range cmd.Flags {
		sf, ok := f.(*cli.StringFlag)
		if !ok || !sf.TakesFile || sf.Destination == nil {
			continue
		}
		p := *sf.Destination
		if p == "" || filepath.IsAbs(p) || strings.Contains(p, "://") {
			continue
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return fmt.Errorf("--%s: %w", sf.Name, err)
		}
		*sf.Destination = abs
	}
	return nil
}

// unexpectedArgument explains the usual cause: a value after a boolean
// flag, which takes none (--flag means true, --flag=false turns it off).
func unexpectedArgument(cmd *cli.Command, args []string, arg string) error {
	i := slices.Index(args, arg)
	if _, err := strconv.ParseBool(arg); err == nil && i > 0 {
		name := strings.TrimLeft(args[i-1], "-")
		for _, f := range cmd.Flags {
			if _, isBool := f.(*cli.BoolFlag); isBool && slices.Contains(f.Names(), name) {
				return fmt.Errorf("unexpected argument %q: --%s takes no separate value (write --%s or --%s=%s)", arg, name, name, name, strings.ToLower(arg))
			}
		}
	}
	return fmt.Errorf("unexpected argument %q", arg)
}

// ExitCode is a service's exit status for what its run returned: 0 when
// it ended cleanly or printed help, 2 for a usage error (already
// explained on stderr), 1 otherwise, after writing "command: err" to
// stderr.
func ExitCode(command string, err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", command, err)
		return 1
	}
}
