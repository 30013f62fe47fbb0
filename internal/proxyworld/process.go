// Package proxyworld is the end-to-end tests' world of real processes:
// gradient-server, gradient-proxy and gradient-worker binaries built from
// this module once per test binary, started on loopback with their own
// data directories, driven through their admin APIs and the gradient CLI,
// and stopped when the test ends. The federation tests use it; the job
// forwarding tests build on it.
package proxyworld

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// The binaries the world runs, built by Binary.
var commands = []string{"gradient", "gradient-server", "gradient-worker", "gradient-proxy"}

var build struct {
	once sync.Once
	dir  string
	err  error
}

// Main runs the tests, then removes the built binaries and this run's
// PostgreSQL database (sqldbtest.Main); call it from TestMain.
func Main(m *testing.M) int {
	code := sqldbtest.Main(m)
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	return code
}

// Binary is the path of command (gradient, gradient-server,
// gradient-worker or gradient-proxy), built from this module at the
// first call of the test binary.
func Binary(tb testing.TB, command string) string {
	tb.Helper()
	build.once.Do(func() {
		if build.dir, build.err = os.MkdirTemp("", "gradient-proxyworld-bin-"); build.err != nil {
			return
		}
		args := []string{"build", "-o", build.dir + string(filepath.Separator)}
		for _, c := range commands {
			args = append(args, "gradient.dev/gradient/cmd/"+c)
		}
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		tb.Fatal(build.err)
	}
	return filepath.Join(build.dir, command)
}

// Process is a running command whose output (stdout and stderr) is kept:
// logged when the test fails, searchable meanwhile.
type Process struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}

	mu  sync.Mutex
	out bytes.Buffer
	// listening receives the address of the first log line that
	// announces one ("… listening" address=HOST:PORT).
	listening chan string
	announced bool
	partial   []byte
}

var listeningLine = regexp.MustCompile(`msg="[^"]*listening[^"]*".* address=(\S+)`)

func (p *Process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out.Write(b)
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		if m := listeningLine.FindSubmatch(p.partial[:i]); m != nil && !p.announced {
			p.announced = true
			p.listening <- string(m[1])
		}
		p.partial = p.partial[i+1:]
	}
	return len(b), nil
}

// Start runs command (a name Binary builds) with args and the test's
// environment plus env; the test's end stops it (Stop).
func Start(tb testing.TB, name, command string, env []string, args ...string) *Process {
	tb.Helper()
	return StartIn(tb, "", name, command, env, args...)
}

// StartIn is Start in the working directory dir ("" is the test's), for
// commands given relative paths.
func StartIn(tb testing.TB, dir, name, command string, env []string, args ...string) *Process {
	tb.Helper()
	return startWrapped(tb, dir, name, nil, command, env, args...)
}

// startWrapped is StartIn with the binary run by wrapper (e.g. prlimit
// with its options), which must exec it in its own place.
func startWrapped(tb testing.TB, dir, name string, wrapper []string, command string, env []string, args ...string) *Process {
	tb.Helper()
	argv := append(append(slices.Clone(wrapper), Binary(tb, command)), args...)
	p := &Process{Name: name, cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{}), listening: make(chan string, 1)}
	p.cmd.Dir = dir
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		p.Stop()
		if tb.Failed() {
			tb.Logf("%s (%s, pid %d) output:\n%s", name, command, p.cmd.Process.Pid, p.Output())
		}
	})
	return p
}

// ListenAddress waits for the process to log the address it listens on
// (HOST:PORT).
func (p *Process) ListenAddress(tb testing.TB) string {
	tb.Helper()
	return p.listenAddress(tb)
}

// listenAddress waits for the process to log the address it listens on.
func (p *Process) listenAddress(tb testing.TB) string {
	tb.Helper()
	select {
	case addr := <-p.listening:
		return addr
	case <-p.done:
		tb.Fatalf("%s exited before listening: %v\n%s", p.Name, p.cmd.ProcessState, p.Output())
	case <-time.After(60 * time.Second):
		tb.Fatalf("%s did not listen within 60 s:\n%s", p.Name, p.Output())
	}
	return ""
}

// Output is everything the process wrote so far.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Lines are the output's lines that contain every one of fragments.
func (p *Process) Lines(fragments ...string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(p.Output()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		all := true
		for _, f := range fragments {
			all = all && strings.Contains(line, f)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process as its service manager would, SIGTERM, and
// kills it if it has not exited 30 s later. Stopping twice is fine.
func (p *Process) Stop() {
	if p.Exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill ends the process with SIGKILL, as a machine dying would (no
// cleanup, no goodbye), and waits until it is gone.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// writeSecret writes a secret file only its owner reads.
func writeSecret(tb testing.TB, dir, name, content string) string {
	tb.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// decode unmarshals a JSON answer into out, failing the test with the
// text when it does not fit.
func decode(tb testing.TB, what string, data []byte, out any) {
	tb.Helper()
	if out == nil {
		return
	}
	if err := json.Unmarshal(data, out); err != nil {
		tb.Fatalf("%s: %v in %s", what, err, data)
	}
}
