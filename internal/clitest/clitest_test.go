package clitest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/urfave/cli/v3"
)

// recorder is a testing.TB that keeps the failures instead of failing.
type recorder struct {
	testing.TB
	failures []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

func TestFindsAFlagWithoutAVariableInASubcommand(t *testing.T) {
	tree := &cli.Command{Name: "x",
		Flags: []cli.Flag{&cli.StringFlag{Name: "server", Sources: cli.EnvVars("X_SERVER")}},
		Commands: []*cli.Command{{Name: "sub",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "wait"}, &cli.IntFlag{Name: "limit", Sources: cli.EnvVars("X_LIMIT")}}}},
	}
	r := &recorder{TB: t}
	EveryFlagHasAVariable(r, tree)
	if len(r.failures) != 1 || !strings.Contains(r.failures[0], "x sub --wait") {
		t.Errorf("failures %q, want one for x sub --wait", r.failures)
	}
}

func TestHelpMustNameTheVariables(t *testing.T) {
	cmd := &cli.Command{Name: "x", Flags: []cli.Flag{&cli.StringFlag{Name: "server", Sources: cli.EnvVars("X_SERVER", "X_URL")}}}
	r := &recorder{TB: t}
	HelpListsEveryVariable(r, cmd, "   --server string  where [$X_SERVER]\n")
	if len(r.failures) != 1 || !strings.Contains(r.failures[0], "$X_URL") {
		t.Errorf("failures %q, want one for $X_URL", r.failures)
	}
	r = &recorder{TB: t}
	HelpListsEveryVariable(r, cmd, "   --server string  where [$X_SERVER, $X_URL]\n")
	if len(r.failures) != 0 {
		t.Errorf("complete help: %q", r.failures)
	}
}
