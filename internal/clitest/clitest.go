// Package clitest checks a urfave/cli command tree the way operators rely
// on it: every flag of every command can be set by an environment
// variable, and -h says which.
package clitest

import (
	"strings"
	"testing"

	"github.com/urfave/cli/v3"
)

// Flag is one flag of the tree and the command path it belongs to.
type Flag struct {
	Command string // e.g. "gradient worker register"
	Flag    cli.Flag
}

// Flags lists every flag of cmd and its subcommands, without the
// library's own --help and --version.
func Flags(cmd *cli.Command) []Flag {
	var out []Flag
	var walk func(path string, c *cli.Command)
	walk = func(path string, c *cli.Command) {
		for _, f := range c.Flags {
			if f == cli.HelpFlag || f == cli.VersionFlag {
				continue
			}
			out = append(out, Flag{Command: path, Flag: f})
		}
		for _, sub := range c.Commands {
			walk(path+" "+sub.Name, sub)
		}
	}
	walk(cmd.Name, cmd)
	return out
}

// Variables are the environment variables that set f, in precedence order.
func Variables(f cli.Flag) []string {
	if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
		return ev.GetEnvVars()
	}
	return nil
}

// EveryFlagHasAVariable fails for each flag in cmd's tree that no
// environment variable sets.
func EveryFlagHasAVariable(t testing.TB, cmd *cli.Command) {
	t.Helper()
	flags := Flags(cmd)
	if len(flags) == 0 {
		t.Fatalf("%s has no flags: the check would prove nothing", cmd.Name)
	}
	for _, f := range flags {
		if len(Variables(f.Flag)) == 0 {
			t.Errorf("%s --%s has no environment variable", f.Command, f.Flag.Names()[0])
		}
	}
}

// HelpListsEveryVariable fails unless help (the output of cmd -h) names
// every top-level flag of cmd and each of its variables.
func HelpListsEveryVariable(t testing.TB, cmd *cli.Command, help string) {
	t.Helper()
	for _, f := range cmd.Flags {
		if f == cli.HelpFlag || f == cli.VersionFlag {
			continue
		}
		line := helpLine(help, "--"+f.Names()[0]+" ")
		if line == "" {
			t.Errorf("help lacks --%s:\n%s", f.Names()[0], help)
			continue
		}
		for _, v := range Variables(f) {
			if !strings.Contains(line, "$"+v) {
				t.Errorf("help of --%s lacks $%s: %q", f.Names()[0], v, line)
			}
		}
	}
}

// helpLine is the line of help that starts with the flag.
func helpLine(help, flag string) string {
	for _, l := range strings.Split(help, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), flag) {
			return l
		}
	}
	return ""
}
