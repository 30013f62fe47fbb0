// Package envflag reads a command's flags with an environment variable
// behind each one, the way operators configure services under systemd:
// a flag wins over its variable, and the variable over the default.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// ErrUsage is a configuration error already explained on stderr.
var ErrUsage = errors.New("usage error")

// Setting is one flag, the environment variable that sets it when the flag
// is absent, its default and its help text.
type Setting struct {
	Flag, Env, Default, Usage string
}

// Values are the parsed settings.
type Values struct {
	raw    map[string]*string
	given  map[string]bool
	getenv func(string) string
}

// Parse reads args for settings. Values stay strings so flags and
// variables share one parser per setting (the caller's). It returns
// flag.ErrHelp for -h, ErrUsage for anything wrong (explained on stderr).
func Parse(command string, args []string, settings []Setting, getenv func(string) string, stderr io.Writer, usage func(io.Writer)) (*Values, error) {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	v := &Values{raw: map[string]*string{}, given: map[string]bool{}, getenv: getenv}
	for _, s := range settings {
		v.raw[s.Flag] = fs.String(s.Flag, "", "")
	}
	fs.Usage = func() { usage(stderr) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, ErrUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", command, fs.Arg(0))
		return nil, ErrUsage
	}
	fs.Visit(func(f *flag.Flag) { v.given[f.Name] = true })
	return v, nil
}

// Get is the flag's value if given, else its variable's if set, else the
// default.
func (v *Values) Get(s Setting) string {
	if v.given[s.Flag] {
		return *v.raw[s.Flag]
	}
	if e := v.getenv(s.Env); e != "" {
		return e
	}
	return s.Default
}

// Given reports whether the flag itself was on the command line.
func (v *Values) Given(s Setting) bool { return v.given[s.Flag] }

// PrintUsage writes intro, then every setting with its variable and
// default.
func PrintUsage(w io.Writer, intro string, settings []Setting) {
	fmt.Fprint(w, intro)
	for _, s := range settings {
		fmt.Fprintf(w, "  --%s (env %s)\n", s.Flag, s.Env)
		line := "        " + s.Usage
		if s.Default != "" {
			line += " (default " + s.Default + ")"
		}
		fmt.Fprintln(w, line)
	}
}

// NewLogger is a service's structured logger: text or JSON on w.
func NewLogger(level slog.Level, format string, w io.Writer) *slog.Logger {
	h := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, h))
	}
	return slog.New(slog.NewTextHandler(w, h))
}
