package main

// The command tree on urfave/cli v3: one *cli.Command per command and
// subcommand, built anew for every run (a Command keeps parse state), with
// the run's environment, streams and exit codes.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v3"
)

// app is one run of the CLI: its environment, streams, and what
// gradient up runs once its flags are checked (tests replace it).
type app struct {
	ctx    context.Context
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	up     func(ctx context.Context, o upOptions, stdout, stderr io.Writer) int

	origins map[string]*flagOrigin // of the global flags, by name
}

// Metadata keys on commands, read by the help and the global-flag check.
const (
	// metaNoAdminFlags marks commands that refuse --server, --token,
	// --token-file and --json (wire, up).
	metaNoAdminFlags = "noAdminFlags"
	// metaHelpOnStderr marks commands whose stdout is only their result.
	metaHelpOnStderr = "helpOnStderr"
	// metaProxy marks the proxy's commands, which take --proxy and its
	// token instead of --server, --token and --token-file.
	metaProxy = "proxy"
)

// exitStatus ends a command that has already said why on stderr.
type exitStatus int

func (e exitStatus) Error() string { return "exit status " + strconv.Itoa(int(e)) }
func (e exitStatus) ExitCode() int { return int(e) }

// exitWith turns a command's exit code into the error its Action returns.
func exitWith(code int) error {
	if code == exitOK {
		return nil
	}
	return exitStatus(code)
}

// run parses args (without the program name), runs the command and
// returns its exit code: 0 ok, 1 failure, 2 usage.
func (a *app) run(args []string) int {
	root := a.rootCommand()
	err := root.Run(a.ctx, append([]string{"gradient"}, args...))
	var status exitStatus
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &status):
		return int(status)
	}
	// The library's own errors, e.g. a variable holding a bad value or
	// `gradient help nope`.
	fmt.Fprintf(a.stderr, "gradient: %s\n", withFlagDashes(err.Error()))
	var coder cli.ExitCoder
	if errors.As(err, &coder) && coder.ExitCode() == exitFail {
		return exitFail
	}
	return exitUsage
}

func (a *app) rootCommand() *cli.Command {
	root := &cli.Command{
		Name:  "gradient",
		Usage: "The Gradient operator tool: admin commands for gradient-server's admin API, evaluations and builds, the protocol debugger and the quick start.",
		Description: "A PROJECT is TEAM/NAME or the project's UUID; teams and caches are names or UUIDs.\n" +
			"Flags may come before or after positional arguments; everything after -- is positional.\n" +
			"Exit status: 0 ok, 1 failure, 2 usage error.",
		Flags:                 a.globalFlags(),
		EnableShellCompletion: true,
		ShellComplete:         completeRoot,
		Reader:                a.stdin,
		Writer:                a.stdout,
		ErrWriter:             a.stderr,
		// Exit codes are run's business, never os.Exit's.
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
		Action:         a.groupAction(exitOK),
		Commands: []*cli.Command{
			a.upCommand(),
			a.wireCommand(),
			a.teamCommand(),
			a.projectCommand(),
			a.cacheCommand(),
			a.workerCommand(),
			a.serverCommand(),
			a.evalCommand(),
			a.buildCommand(),
			a.tokenCommand(),
			a.proxyCommand(),
		},
	}
	root.Walk(func(c *cli.Command) error {
		c.OnUsageError = a.usageError
		if c != root {
			// `help` stays a command of the root only: below it, a word
			// such as "help" is a positional argument.
			c.HideHelpCommand = true
		}
		return nil
	})
	return root
}

// globalFlags are the admin settings, persistent: they may come before
// the command (gradient --server URL team list) or after it.
func (a *app) globalFlags() []cli.Flag {
	a.origins = map[string]*flagOrigin{}
	origin := func(name string) *flagOrigin {
		o := &flagOrigin{}
		a.origins[name] = o
		return o
	}
	server, token, tokenFile, json := origin("server"), origin("token"), origin("token-file"), origin("json")
	return []cli.Flag{
		&cli.StringFlag{Name: "server", Usage: "gradient-server's `URL`", Value: defaultServer,
			Sources: a.trackedEnv("GRADIENT_SERVER", server), Validator: countSets[string](server)},
		&cli.StringFlag{Name: "token", Usage: "admin `TOKEN`",
			Sources: a.trackedEnv("GRADIENT_ADMIN_TOKEN", token), Validator: countSets[string](token)},
		&cli.StringFlag{Name: "token-file", Usage: "`FILE` holding the admin token", TakesFile: true,
			Sources: a.trackedEnv("GRADIENT_ADMIN_TOKEN_FILE", tokenFile), Validator: countSets[string](tokenFile)},
		&cli.BoolFlag{Name: "json", Usage: "print the server's (or proxy's) JSON instead of text", Validator: countSets[bool](json)},
	}
}

// adminFlagNames are globalFlags' names, for rejectAdminFlags.
var adminFlagNames = []string{"server", "token", "token-file", "json"}

// flagOrigin tells whether the command line gave a flag a value, which
// the library, merging flag and variable into one value, does not say.
// The flag's variable notes a value it supplied; the flag's Validator,
// which the library calls on every value it sets, counts them.
type flagOrigin struct {
	fromEnv bool
	sets    int
}

func countSets[T any](o *flagOrigin) func(T) error {
	return func(T) error {
		o.sets++
		return nil
	}
}

// onCommandLine reports whether the flag was given before or after the
// command.
func (o *flagOrigin) onCommandLine() bool {
	n := o.sets
	if o.fromEnv {
		n--
	}
	return n > 0
}

// envVar is a flag's environment variable, read through the run's getenv
// (tests pass their own environment). An empty variable counts as unset.
type envVar struct {
	key    string
	getenv func(string) string
	origin *flagOrigin // noted when the variable supplies the value; may be nil
}

func (e envVar) Lookup() (string, bool) {
	v := e.getenv(e.key)
	if v != "" && e.origin != nil {
		e.origin.fromEnv = true
	}
	return v, v != ""
}
func (e envVar) IsFromEnv() bool  { return true }
func (e envVar) Key() string      { return e.key }
func (e envVar) String() string   { return "environment variable " + strconv.Quote(e.key) }
func (e envVar) GoString() string { return "envVar{" + strconv.Quote(e.key) + "}" }

// env is the Sources of a flag read from the variable key.
func (a *app) env(key string) cli.ValueSourceChain {
	return a.trackedEnv(key, nil)
}

func (a *app) trackedEnv(key string, o *flagOrigin) cli.ValueSourceChain {
	return cli.NewValueSourceChain(envVar{key: key, getenv: a.getenv, origin: o})
}

// givenOnCommandLine reports whether the global flag name was given on
// the command line rather than by its variable.
func (a *app) givenOnCommandLine(name string) bool {
	o := a.origins[name]
	return o != nil && o.onCommandLine()
}

// rejectAdminFlags is the Before of commands that do not talk to the
// admin API: --server and the others given there are a mistake.
func (a *app) rejectAdminFlags(ctx context.Context, cmd *cli.Command) (context.Context, error) {
	for _, name := range adminFlagNames {
		if a.givenOnCommandLine(name) {
			fmt.Fprintf(a.stderr, "%s: --server, --token, --token-file and --json go with an admin command, not --%s here\n", cmd.FullName(), name)
			return ctx, exitStatus(exitUsage)
		}
	}
	return ctx, nil
}

// usageError reports a flag the library could not parse, naming it.
func (a *app) usageError(_ context.Context, cmd *cli.Command, err error, _ bool) error {
	fmt.Fprintf(a.stderr, "%s: %s\n", cmd.FullName(), withFlagDashes(err.Error()))
	fmt.Fprintf(a.stderr, "Run '%s -h' for its flags.\n", cmd.FullName())
	return exitStatus(exitUsage)
}

// libraryFlagName matches a flag name in the library's messages ("for
// flag -limit", "not defined: -bogus", "for flag limit").
var libraryFlagName = regexp.MustCompile(`(for flag |not defined: )-?([A-Za-z][A-Za-z0-9-]+)`)

// withFlagDashes writes flags in the library's messages as users type
// them and the help shows them: --limit.
func withFlagDashes(msg string) string {
	return libraryFlagName.ReplaceAllString(msg, "${1}--${2}")
}

// groupAction runs for a command with subcommands when no subcommand
// follows it: help on stdout when that is its whole job (missing is 0),
// a usage error otherwise; an unknown word is always a usage error.
func (a *app) groupAction(missing int) cli.ActionFunc {
	return func(ctx context.Context, cmd *cli.Command) error {
		args := cmd.Args()
		switch {
		case args.Len() == 0 && missing == exitOK, args.First() == "help":
			printHelp(a.stdout, "", cmd)
			return nil
		case args.Len() == 0:
			fmt.Fprintf(a.stderr, "%s: missing subcommand\n\n", cmd.FullName())
		case cmd.Root() == cmd:
			fmt.Fprintf(a.stderr, "gradient: unknown command %q\n\n", args.First())
		default:
			name := strings.Join(append(cmd.Path()[1:], args.First()), " ")
			fmt.Fprintf(a.stderr, "gradient: unknown command %q: %q is an unknown subcommand of %s\n\n", name, args.First(), cmd.Name)
		}
		printHelp(a.stderr, "", cmd)
		return exitStatus(exitUsage)
	}
}

// positional checks that cmd got exactly the positional arguments named
// by want, none of them blank, and returns them.
func (a *app) positional(cmd *cli.Command, want []string) ([]string, bool) {
	pos := cmd.Args().Slice()
	if len(pos) != len(want) {
		if len(want) == 0 {
			fmt.Fprintf(a.stderr, "%s: unexpected argument %q: want no arguments\n", cmd.FullName(), pos[0])
		} else {
			fmt.Fprintf(a.stderr, "%s: want %s, got %d argument(s)\n", cmd.FullName(), strings.Join(want, " "), len(pos))
		}
		return nil, false
	}
	for i, p := range pos {
		if strings.TrimSpace(p) == "" {
			fmt.Fprintf(a.stderr, "%s: %s is empty\n", cmd.FullName(), want[i])
			return nil, false
		}
	}
	return pos, true
}

// completeRoot lists the root's commands, or its flags when the word
// being completed starts with "-". The library's default completion reads
// os.Args at the root rather than the arguments the run was given.
func completeRoot(_ context.Context, cmd *cli.Command) {
	w := cmd.Root().Writer
	args := cmd.Args().Slice()
	if n := len(args); n > 0 && strings.HasPrefix(args[n-1], "-") {
		prefix := strings.TrimLeft(args[n-1], "-")
		for _, f := range cmd.VisibleFlags() {
			name := f.Names()[0]
			if len(name) > 1 && strings.HasPrefix(name, prefix) {
				fmt.Fprintf(w, "--%s\n", name)
			}
		}
		return
	}
	for _, c := range cmd.VisibleCommands() {
		fmt.Fprintf(w, "%s:%s\n", c.Name, c.Usage)
	}
}

func init() {
	cli.HelpPrinter = printHelp
}

// printHelp renders every help text with the templates below, on the
// writer the library asks for (stdout), except for commands marked
// metaHelpOnStderr (gradient up), whose stdout is their summary alone.
func printHelp(w io.Writer, _ string, data any) {
	cmd, ok := data.(*cli.Command)
	if !ok {
		return
	}
	if metadata(cmd, metaHelpOnStderr) {
		w = cmd.Root().ErrWriter
	}
	tmpl := leafHelp
	switch {
	case cmd.Root() == cmd:
		tmpl = rootHelp
	case len(cmd.VisibleCommands()) > 0:
		tmpl = groupHelp
	}
	cli.HelpPrinterCustom(w, tmpl, cmd, map[string]any{
		"overview":    overview,
		"globalFlags": globalFlagsOf,
	})
}

// metadata reports whether cmd or one of its ancestors carries key.
func metadata(cmd *cli.Command, key string) bool {
	for _, c := range cmd.Lineage() {
		if on, _ := c.Metadata[key].(bool); on {
			return true
		}
	}
	return false
}

// globalFlagsOf are the persistent flags cmd takes (none for wire and up).
func globalFlagsOf(cmd *cli.Command) []cli.Flag {
	if metadata(cmd, metaNoAdminFlags) {
		return nil
	}
	flags := cmd.VisiblePersistentFlags()
	if metadata(cmd, metaProxy) {
		flags = slices.DeleteFunc(flags, func(f cli.Flag) bool { return slices.Contains([]string{"server", "token", "token-file"}, f.Names()[0]) })
	}
	return flags
}

// overview lists every command below cmd with its arguments and usage,
// one per line, aligned.
func overview(cmd *cli.Command) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	var walk func(*cli.Command)
	walk = func(c *cli.Command) {
		for _, sub := range c.VisibleCommands() {
			if sub.Name == "help" {
				continue
			}
			if len(sub.VisibleCommands()) > 0 {
				walk(sub)
				continue
			}
			line := strings.Join(sub.Path()[1:], " ")
			if sub.ArgsUsage != "" {
				line += " " + sub.ArgsUsage
			}
			fmt.Fprintf(tw, "  %s\t%s\n", line, sub.Usage)
		}
	}
	walk(cmd)
	tw.Flush()
	return b.String()
}

const rootHelp = `Usage: gradient [global options] <command> [arguments]

{{.Usage}}

Commands:
{{overview .}}
{{.Description}}

Global options, before or after an admin or evaluation command:{{template "visibleFlagTemplate" .}}

Run gradient COMMAND -h for a command's flags, with their variables and defaults.
Shell completion: source <(gradient completion bash) in ~/.bashrc, likewise zsh;
gradient completion fish > ~/.config/fish/completions/gradient.fish for fish.
`

const groupHelp = `Usage: {{.FullName}} <command> [arguments]

{{.Usage}}{{if .Description}}

{{.Description}}{{end}}

Commands:
{{overview .}}{{with globalFlags .}}
Global options, before or after the command:{{range .}}
   {{wrap .String 6}}{{end}}
{{end}}
Run {{.FullName}} COMMAND -h for a command's flags.
`

const leafHelp = `Usage: {{.FullName}}{{if .VisibleFlags}} [options]{{end}}{{if .ArgsUsage}} {{.ArgsUsage}}{{end}}

{{.Usage}}{{if .Description}}

{{.Description}}{{end}}

Options:{{template "visibleFlagTemplate" .}}{{with globalFlags .}}

Global options, before or after the command:{{range .}}
   {{wrap .String 6}}{{end}}{{end}}
`
