// Command gradient is the Gradient operator tool: admin commands that talk
// to gradient-server's admin API (teams, projects, caches, worker
// registrations), the protocol debugger (`gradient wire ...`) and the
// quick start (`gradient up`, up.go).
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v3"

	"gradient.dev/gradient/internal/termsafe"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/wire/wirejson"
)

// Exit codes: 1 for a failure (a server error, an input line that did
// not convert), 2 for a usage error.
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
	// Everything the CLI prints may carry text from elsewhere (a build's
	// log, a worker's reason, a server's error): control sequences in it
	// are shown, never acted on by the operator's terminal.
	safeOut, safeErr := termsafe.NewWriter(stdout), termsafe.NewWriter(stderr)
	defer safeErr.Flush()
	defer safeOut.Flush()
	a := &app{ctx: context.Background(), getenv: getenv, stdin: stdin, stdout: safeOut, stderr: safeErr, up: runUpUntilSignal}
	return a.run(args)
}

// The protocol debugger, gradient wire: it reads stdin and talks to no
// server.
func (a *app) wireCommand() *cli.Command {
	version := func() cli.Flag {
		return &cli.UintFlag{Name: "version", Usage: "protocol version `N`", Value: uint(wire.NewestVersion)}
	}
	side := func() cli.Flag {
		return &cli.StringFlag{Name: "side", Usage: "message `DIRECTION`: client (worker → server) or server (server → worker)"}
	}
	codec := func(name, usage string, conv lineFunc) *cli.Command {
		return &cli.Command{
			Name:  name,
			Usage: usage,
			Flags: []cli.Flag{side(), version()},
			Action: func(_ context.Context, cmd *cli.Command) error {
				if _, ok := a.positional(cmd, nil); !ok {
					return exitStatus(exitUsage)
				}
				return exitWith(a.runCodec(cmd, conv))
			},
		}
	}
	return &cli.Command{
		Name:     "wire",
		Usage:    "the protocol debugger: frames and messages of every supported protocol version",
		Metadata: map[string]any{metaNoAdminFlags: true},
		Before:   a.rejectAdminFlags,
		Action:   a.groupAction(exitUsage),
		Commands: []*cli.Command{
			codec("decode", "read hex frames from stdin, one per line; print one JSON message per line", decodeLine),
			codec("encode", "read JSON messages from stdin, one per line; print one hex frame per line", encodeLine),
			{
				Name:  "schema",
				Usage: "print the wire schema of a protocol version",
				Flags: []cli.Flag{version()},
				Action: func(_ context.Context, cmd *cli.Command) error {
					if _, ok := a.positional(cmd, nil); !ok {
						return exitStatus(exitUsage)
					}
					v, err := checkVersion(cmd.Uint("version"))
					if err != nil {
						fmt.Fprintf(a.stderr, "%s: %v\n", cmd.FullName(), err)
						return exitStatus(exitUsage)
					}
					fmt.Fprint(a.stdout, wire.Schema(v))
					return nil
				},
			},
			{
				Name:  "versions",
				Usage: "print the protocol range this build speaks",
				Action: func(_ context.Context, cmd *cli.Command) error {
					if _, ok := a.positional(cmd, nil); !ok {
						return exitStatus(exitUsage)
					}
					fmt.Fprintln(a.stdout, wire.Supported)
					return nil
				},
			},
		},
	}
}

// lineFunc turns one trimmed, non-blank input line into one output line.
type lineFunc func(line string, client bool, ver uint16) (string, error)

func (a *app) runCodec(cmd *cli.Command, conv lineFunc) int {
	name, stdin, stdout, stderr := cmd.Name, a.stdin, a.stdout, a.stderr
	var client bool
	switch cmd.String("side") {
	case "client":
		client = true
	case "server":
	default:
		fmt.Fprintf(stderr, "gradient wire %s: --side must be client or server\n", name)
		return exitUsage
	}
	v, err := checkVersion(cmd.Uint("version"))
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
