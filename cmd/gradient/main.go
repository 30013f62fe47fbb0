// Command gradient is the Gradient operator tool: admin commands that talk
// to gradient-server's admin API (teams, projects, caches, worker
// registrations), the protocol debugger (`gradient wire ...`) and the
// quick start (`gradient up`, up.go).
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/wire/wirejson"
)

const usage = `Usage: gradient [--server URL] [--token TOKEN] <command> [arguments]

Commands:
  up [FLAKE]               run a server and local workers, build FLAKE
                           (default: the example flake); see up -h
  wire decode --side client|server [--version N]
                           read hex frames from stdin, one per line;
                           print one JSON message per line
  wire encode --side client|server [--version N]
                           read JSON messages from stdin, one per line;
                           print one hex frame per line
  wire schema [--version N]
                           print the wire schema of protocol N
  wire versions            print the protocol range this build speaks
  help                     show this help

--version defaults to the newest supported protocol.

` + adminUsage + "\n" + evalUsage

// Exit codes: 1 when some input line failed, 2 for a usage error.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the whole command, separated from main so tests drive it with
// buffers.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runWithEnv(args, os.Getenv, stdin, stdout, stderr)
}

// runWithEnv is run with the environment as a function, so tests of the
// admin commands control GRADIENT_SERVER and the token variables.
func runWithEnv(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && strings.HasPrefix(args[0], "-") && !isHelp(args[0]) {
		return runAdminWithLeadingFlags(args, getenv, stdout, stderr)
	}
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "team", "project", "cache", "worker", "server", "eval", "build":
		return runAdmin(context.Background(), adminSettings{}, args, getenv, stdout, stderr)
	case "up":
		return runUp(args[1:], stdout, stderr)
	case "wire":
		return runWire(args[1:], stdin, stdout, stderr)
	}
	fmt.Fprintf(stderr, "gradient: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

// runAdminWithLeadingFlags takes admin settings before the command:
// gradient --server URL team list.
func runAdminWithLeadingFlags(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	var settings adminSettings
	fs := newFlagSet("", stderr)
	settings.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 || !isAdminGroup(rest[0]) {
		fmt.Fprintf(stderr, "gradient: --server, --token, --token-file and --json go with an admin command\n\n%s", usage)
		return exitUsage
	}
	return runAdmin(context.Background(), settings, rest, getenv, stdout, stderr)
}

func runWire(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, "gradient wire: missing subcommand\n\n%s", usage)
		return exitUsage
	}
	switch args[0] {
	case "decode":
		return runCodec(args[0], args[1:], stdin, stdout, stderr, decodeLine)
	case "encode":
		return runCodec(args[0], args[1:], stdin, stdout, stderr, encodeLine)
	case "schema":
		fs := newFlagSet("wire schema", stderr)
		ver := fs.Uint("version", uint(wire.NewestVersion), "protocol version")
		if code, ok := parse(fs, args[1:]); !ok {
			return code
		}
		v, err := checkVersion(*ver)
		if err != nil {
			fmt.Fprintf(stderr, "gradient wire schema: %v\n", err)
			return exitUsage
		}
		fmt.Fprint(stdout, wire.Schema(v))
		return exitOK
	case "versions":
		fs := newFlagSet("wire versions", stderr)
		if code, ok := parse(fs, args[1:]); !ok {
			return code
		}
		fmt.Fprintln(stdout, wire.Supported)
		return exitOK
	}
	fmt.Fprintf(stderr, "gradient wire: unknown subcommand %q\n\n%s", args[0], usage)
	return exitUsage
}

// lineFunc turns one trimmed, non-blank input line into one output line.
type lineFunc func(line string, client bool, ver uint16) (string, error)

func runCodec(name string, args []string, stdin io.Reader, stdout, stderr io.Writer, conv lineFunc) int {
	fs := newFlagSet("wire "+name, stderr)
	sideFlag := fs.String("side", "", "message direction: client (worker → server) or server (server → worker)")
	ver := fs.Uint("version", uint(wire.NewestVersion), "protocol version")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	var client bool
	switch *sideFlag {
	case "client":
		client = true
	case "server":
	default:
		fmt.Fprintf(stderr, "gradient wire %s: --side must be client or server\n", name)
		return exitUsage
	}
	v, err := checkVersion(*ver)
	if err != nil {
		fmt.Fprintf(stderr, "gradient wire %s: %v\n", name, err)
		return exitUsage
	}

	out := bufio.NewWriter(stdout)
	defer out.Flush()
	// A bufio.Reader rather than a Scanner: a frame's hex line has no
	// useful upper bound.
	in := bufio.NewReader(stdin)
	code := exitOK
	for lineNo := 1; ; lineNo++ {
		line, readErr := in.ReadString('\n')
		if s := strings.TrimSpace(line); s != "" {
			res, err := conv(s, client, v)
			if err != nil {
				// Flush first so stdout and stderr interleave in input order.
				out.Flush()
				fmt.Fprintf(stderr, "line %d: %v\n", lineNo, err)
				code = exitFail
			} else {
				out.WriteString(res)
				out.WriteByte('\n')
			}
		}
		if readErr == io.EOF {
			break
		}
		if readErr != nil {
			out.Flush()
			fmt.Fprintf(stderr, "gradient wire %s: reading stdin: %v\n", name, readErr)
			return exitFail
		}
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintf(stderr, "gradient wire %s: writing stdout: %v\n", name, err)
		return exitFail
	}
	return code
}

func decodeLine(line string, client bool, ver uint16) (string, error) {
	frame, err := hex.DecodeString(line)
	if err != nil {
		return "", fmt.Errorf("invalid hex: %w", err)
	}
	var m wire.Message
	if client {
		m, err = wire.DecodeClientMessage(frame, ver)
	} else {
		m, err = wire.DecodeServerMessage(frame, ver)
	}
	if err != nil {
		return "", err
	}
	j, err := wirejson.Marshal(m)
	return string(j), err
}

func encodeLine(line string, client bool, ver uint16) (string, error) {
	var frame []byte
	if client {
		m, err := wirejson.UnmarshalClient([]byte(line))
		if err != nil {
			return "", err
		}
		if frame, err = wire.AppendClientMessage(nil, m, ver); err != nil {
			return "", err
		}
	} else {
		m, err := wirejson.UnmarshalServer([]byte(line))
		if err != nil {
			return "", err
		}
		if frame, err = wire.AppendServerMessage(nil, m, ver); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(frame), nil
}

func checkVersion(v uint) (uint16, error) {
	if v > 0xffff || !wire.Supported.Contains(uint16(v)) {
		return 0, fmt.Errorf("protocol version %d is not supported; this build speaks %s", v, wire.Supported)
	}
	return uint16(v), nil
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gradient "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses args and rejects positional arguments. ok is false when
// the command must stop with code (0 after -h).
func parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %s\n", fs.Name(), strconv.Quote(fs.Arg(0)))
		return exitUsage, false
	}
	return exitOK, true
}
