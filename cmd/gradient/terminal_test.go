package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// hostileLog is what a build may print to take over the operator's
// terminal: a window title (OSC 0), a clipboard write (OSC 52), a screen
// clear and cursor home (CSI 2J, CSI H), an 8-bit CSI (C1 U+009B) and a
// bidi override, around plain text and colour.
const hostileLog = "compiling hello\n" +
	"\x1b]0;pwned-title\x07" +
	"\x1b]52;c;ZWNobyBwd25lZA==\x07" +
	"\x1b[2J\x1b[H" +
	"still here \x1b[31mred\x1b[0m\n" +
	"c1 \u009b2J and raw \x9b2J\n" +
	"bidi \u202eevil\n"

// The real `gradient` binary, on a real pseudo-terminal, against a real
// server whose stored build log and error hold terminal escapes: the
// terminal receives the text, visibly, and none of the escapes but
// colour (issue 26 §6).
func TestTerminalGetsNoEscapesFromABuild(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "gradient")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	s := newEvalServer(t)
	repo, _ := evalGitRepo(t)
	p := webProject(t, s, repo)
	evalID := uuidPattern.FindString(s.ok(t, "eval", "start", "ops/web"))
	buildID := hostileBuild(t, s.db, p.ID)

	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "TERM=xterm",
		"GRADIENT_SERVER=" + s.url, "GRADIENT_ADMIN_TOKEN=" + cliAdminToken}
	sgr := regexp.MustCompile(`\x1b\[[0-9;:]*m`)
	for _, c := range []struct {
		args    []string
		visible []string // what must reach the terminal as text
	}{
		{[]string{"build", "log", buildID}, []string{"compiling hello", `\x1b]0;pwned-title\x07`,
			`\x1b]52;c;ZWNobyBwd25lZA==\x07`, `\x1b[2J\x1b[H`, "still here ", "red", `c1 \u009b2J and raw \x9b2J`, `bidi \u202eevil`}},
		{[]string{"build", "show", buildID}, []string{"builder failed", `\x1b]0;pwned-title\x07`, `\x1b[2J`}},
		{[]string{"eval", "show", evalID}, []string{"builder failed", `\x1b]0;pwned-title\x07`}},
		{[]string{"eval", "log", evalID}, []string{"evaluating", `\x1b]52;c;ZWNobyBwd25lZA==\x07`}},
	} {
		got := onTerminal(t, env, bin, c.args...)
		rest := sgr.ReplaceAllString(got, "")
		for _, bad := range []string{"\x1b", "\x07", "\u009b", "\x9b", "\u202e"} {
			if i := strings.Index(rest, bad); i >= 0 {
				t.Errorf("gradient %s: the terminal received %q at %d:\n%q", strings.Join(c.args, " "), bad, i, got)
			}
		}
		for _, want := range c.visible {
			if !strings.Contains(got, want) {
				t.Errorf("gradient %s: %q not on the terminal:\n%q", strings.Join(c.args, " "), want, got)
			}
		}
	}
}

// hostileBuild plays the project's newest evaluation in storage: its
// flake job and its one build log hostileLog, and the build fails with
// an error that holds escapes too. It returns the build's ID.
func hostileBuild(t *testing.T, db *storage.DB, projectID string) string {
	t.Helper()
	queue := jobqueue.New(db)
	ctx := t.Context()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	worker := storage.NewID()
	ev, flake := flakeJobOf(t, db, projectID, 0)
	a, err := queue.ClaimJob(ctx, flake, worker)
	must(err)
	must(queue.AppendJobLog(ctx, flake, []byte("evaluating\n"+hostileLog)))
	drv := "/nix/store/" + strings.Repeat("a", 32) + "-hello-2.12.drv"
	must(queue.AddDiscoveredDerivations(ctx, ev.ID, []storage.DiscoveredBuild{
		{Attr: "packages.x86_64-linux.hello", DrvPath: drv, Architecture: "x86_64-linux",
			Outputs: []storage.BuildOutputPath{{Name: "out", Path: "/nix/store/" + strings.Repeat("b", 32) + "-hello-2.12"}}},
	}))
	ready, err := queue.CompleteFlakeJob(ctx, a)
	must(err)
	jobs, err := queue.PendingJobsByID(ctx, ready)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("ready %v: %v", jobs, err)
	}
	a, err = queue.ClaimJob(ctx, jobs[0].JobID, worker)
	must(err)
	must(queue.AppendJobLog(ctx, jobs[0].JobID, []byte(hostileLog)))
	_, _, err = queue.FailJob(ctx, a, storage.FailurePermanent, "builder failed \x1b]0;pwned-title\x07\x1b[2J", 3)
	must(err)
	return jobs[0].BuildID
}

// onTerminal runs bin with args on a new pseudo-terminal (its stdin,
// stdout and stderr, and its controlling terminal) and returns what the
// terminal received.
func onTerminal(t *testing.T, env []string, bin string, args ...string) string {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	defer master.Close()
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("ptsname: %v", err)
	}
	tty, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		tty.Close()
		t.Fatal(err)
	}
	tty.Close() // the child holds it; the master reads EIO once it exits
	var got bytes.Buffer
	_, err = io.Copy(&got, master)
	if err != nil && !errors.Is(err, syscall.EIO) {
		t.Fatalf("reading the terminal: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gradient %s: %v\n%q", strings.Join(args, " "), err, got.String())
	}
	return got.String()
}
