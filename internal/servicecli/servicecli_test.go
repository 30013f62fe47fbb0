package servicecli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v3"
)

type parsed struct {
	port    int
	timeout time.Duration
	verbose bool
	cmd     *cli.Command
	env     *Env
	stderr  string
}

func parse(t *testing.T, args []string, vars map[string]string) (parsed, error) {
	t.Helper()
	var p parsed
	p.env = NewEnv(func(k string) string { return vars[k] })
	p.cmd = &cli.Command{Name: "x", Flags: []cli.Flag{
		&cli.IntFlag{Name: "port", Value: 3000, Destination: &p.port, Sources: p.env.Vars("X_PORT", "X_REFERENCE_PORT"), Validator: Positive[int]},
		&SecondsFlag{Name: "timeout", Value: 2 * time.Minute, Destination: &p.timeout, Sources: p.env.Vars("X_TIMEOUT")},
		&cli.BoolFlag{Name: "verbose", Destination: &p.verbose, Sources: p.env.Vars("X_VERBOSE")},
	}}
	var stderr strings.Builder
	err := Parse(t.Context(), p.cmd, args, &stderr, nil)
	p.stderr = stderr.String()
	return p, err
}

func TestPrecedence(t *testing.T) {
	p, err := parse(t, nil, nil)
	if err != nil || p.port != 3000 || p.timeout != 2*time.Minute || p.verbose {
		t.Fatalf("defaults: %+v %v", p, err)
	}
	p, err = parse(t, nil, map[string]string{"X_REFERENCE_PORT": "2", "X_TIMEOUT": "90", "X_VERBOSE": "1"})
	if err != nil || p.port != 2 || p.timeout != 90*time.Second || !p.verbose {
		t.Fatalf("second variable: %+v %v", p, err)
	}
	p, err = parse(t, nil, map[string]string{"X_PORT": "1", "X_REFERENCE_PORT": "2", "X_PORT_UNUSED": ""})
	if err != nil || p.port != 1 {
		t.Fatalf("the first variable listed wins: %d %v", p.port, err)
	}
	p, err = parse(t, []string{"--port=5", "--timeout", "0", "--verbose=false"}, map[string]string{"X_PORT": "1", "X_TIMEOUT": "9", "X_VERBOSE": "true"})
	if err != nil || p.port != 5 || p.timeout != 0 || p.verbose {
		t.Fatalf("flags win: %+v %v", p, err)
	}
	// An empty variable is unset (NixOS modules write unset options so).
	p, err = parse(t, nil, map[string]string{"X_PORT": "", "X_VERBOSE": ""})
	if err != nil || p.port != 3000 || p.verbose {
		t.Fatalf("empty variables: %+v %v", p, err)
	}
}

func TestFromCommandLine(t *testing.T) {
	p, err := parse(t, []string{"--timeout", "5s"}, map[string]string{"X_PORT": "7"})
	if err != nil {
		t.Fatal(err)
	}
	flags := p.cmd.Flags
	if p.env.FromCommandLine(p.cmd, flags[0]) || !p.env.FromCommandLine(p.cmd, flags[1]) || p.env.FromCommandLine(p.cmd, flags[2]) {
		t.Errorf("port (env), timeout (flag), verbose (default): %v %v %v", p.env.FromCommandLine(p.cmd, flags[0]),
			p.env.FromCommandLine(p.cmd, flags[1]), p.env.FromCommandLine(p.cmd, flags[2]))
	}
}

func TestErrorsNameTheFlagAndVariable(t *testing.T) {
	for _, c := range []struct {
		args []string
		vars map[string]string
		want []string
	}{
		{[]string{"--port", "0"}, nil, []string{"port", "want a positive number"}},
		{nil, map[string]string{"X_REFERENCE_PORT": "many"}, []string{"port", "X_REFERENCE_PORT"}},
		{[]string{"--timeout", "-3s"}, nil, []string{"timeout", "want a duration"}},
		{nil, map[string]string{"X_TIMEOUT": "soon"}, []string{"timeout", "X_TIMEOUT"}},
		{[]string{"--nope"}, nil, []string{"nope", "not defined"}},
		{[]string{"extra"}, nil, []string{`unexpected argument "extra"`}},
		{[]string{"--verbose", "false"}, nil, []string{"--verbose takes no separate value", "--verbose=false"}},
	} {
		p, err := parse(t, c.args, c.vars)
		if !errors.Is(err, ErrUsage) {
			t.Errorf("%v %v: %v, want ErrUsage", c.args, c.vars, err)
		}
		for _, w := range c.want {
			if !strings.Contains(p.stderr, w) {
				t.Errorf("%v %v: stderr %q lacks %q", c.args, c.vars, p.stderr, w)
			}
		}
	}
}

func TestHelp(t *testing.T) {
	p, err := parse(t, []string{"-h"}, nil)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"--port int", "(default: 3000)", "[$X_PORT, $X_REFERENCE_PORT]", "(default: 120s)", "[$X_TIMEOUT]"} {
		if !strings.Contains(p.stderr, want) {
			t.Errorf("help lacks %q:\n%s", want, p.stderr)
		}
	}
}

func TestParseSeconds(t *testing.T) {
	for in, want := range map[string]time.Duration{"0": 0, "120": 2 * time.Minute, "90s": 90 * time.Second, "2m": 2 * time.Minute} {
		if got, err := ParseSeconds(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "-5s", "soon", "99999999999999999999"} {
		if _, err := ParseSeconds(in); err == nil {
			t.Errorf("%q: accepted", in)
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
		says string
	}{
		{nil, 0, ""},
		{ErrHelp, 0, ""},
		{fmt.Errorf("--listen: %w", ErrUsage), 2, ""},
		{errors.New("database is gone"), 1, "gradient-x: database is gone\n"},
	} {
		var stderr strings.Builder
		if got := ExitCode("gradient-x", c.err, &stderr); got != c.want || stderr.String() != c.says {
			t.Errorf("ExitCode(%v) = %d, %q; want %d, %q", c.err, got, stderr.String(), c.want, c.says)
		}
	}
}

// Path flags come out absolute, from the command line, a variable or
// the default; empty values and URLs stay as given, and so do flags that
// take no path.
func TestPathFlagsAreAbsolute(t *testing.T) {
	var base, data, key, empty, url, name string
	env := NewEnv(func(k string) string { return map[string]string{"X_KEY_FILE": "keys/x.key"}[k] })
	cmd := &cli.Command{Name: "x", Flags: []cli.Flag{
		&cli.StringFlag{Name: "base-dir", Destination: &base, TakesFile: true, Sources: env.Vars("X_BASE_DIR")},
		&cli.StringFlag{Name: "database", Value: "./data", Destination: &data, TakesFile: true, Sources: env.Vars("X_DATABASE")},
		&cli.StringFlag{Name: "key-file", Destination: &key, TakesFile: true, Sources: env.Vars("X_KEY_FILE")},
		&cli.StringFlag{Name: "empty-file", Destination: &empty, TakesFile: true, Sources: env.Vars("X_EMPTY_FILE")},
		&cli.StringFlag{Name: "url-or-dir", Destination: &url, TakesFile: true, Sources: env.Vars("X_URL_OR_DIR")},
		&cli.StringFlag{Name: "name", Destination: &name, Sources: env.Vars("X_NAME")},
	}}
	args := []string{"--base-dir", "./worker-state", "--url-or-dir", "postgres://db/x", "--name", "./not-a-path"}
	if err := Parse(t.Context(), cmd, args, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		base: filepath.Join(wd, "worker-state"), data: filepath.Join(wd, "data"), key: filepath.Join(wd, "keys/x.key"),
		empty: "", url: "postgres://db/x", name: "./not-a-path",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}
