package envflag

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

var (
	port = Setting{Flag: "port", Env: "X_PORT", Default: "3000", Usage: "port"}
	name = Setting{Flag: "name", Env: "X_NAME", Default: "", Usage: "name"}
)

func parse(t *testing.T, args []string, env map[string]string) (*Values, string, error) {
	t.Helper()
	var stderr bytes.Buffer
	v, err := Parse("x", args, []Setting{port, name}, func(k string) string { return env[k] }, &stderr,
		func(w io.Writer) { PrintUsage(w, "Usage: x\n", []Setting{port, name}) })
	return v, stderr.String(), err
}

func TestFlagBeatsEnvBeatsDefault(t *testing.T) {
	v, _, err := parse(t, []string{"--port", "1"}, map[string]string{"X_PORT": "2", "X_NAME": "env"})
	if err != nil || v.Get(port) != "1" || v.Get(name) != "env" || !v.Given(port) || v.Given(name) {
		t.Fatalf("got %v %q %q", err, v.Get(port), v.Get(name))
	}
	v, _, _ = parse(t, nil, nil)
	if v.Get(port) != "3000" || v.Get(name) != "" {
		t.Fatalf("defaults %q %q", v.Get(port), v.Get(name))
	}
}

func TestUsageAndErrors(t *testing.T) {
	_, out, err := parse(t, []string{"-h"}, nil)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(out, "--port (env X_PORT)") || !strings.Contains(out, "(default 3000)") {
		t.Fatalf("help: %v\n%s", err, out)
	}
	if _, _, err := parse(t, []string{"--nope"}, nil); !errors.Is(err, ErrUsage) {
		t.Fatalf("unknown flag: %v", err)
	}
	if _, out, err := parse(t, []string{"extra"}, nil); !errors.Is(err, ErrUsage) || !strings.Contains(out, `unexpected argument "extra"`) {
		t.Fatalf("argument: %v %s", err, out)
	}
}
