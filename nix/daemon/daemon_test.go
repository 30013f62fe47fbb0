package daemon_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/nix/daemon"
)

// testExpr has derivations built from /bin/sh alone.
const testExpr = `let
  mk = name: script: extra: builtins.derivation ({
    inherit name; system = builtins.currentSystem; builder = "/bin/sh"; args = [ "-c" script ];
  } // extra);
in rec {
  hello = mk "hello" "echo building hello; echo line two; echo hello > $out" {};
  greet = mk "greet" "echo ${hello} > $out" {};
  broken = mk "broken" "echo oops-this-fails; exit 3" {};
  sleepy = mk "sleepy" "echo sleeping; /bin/sleep 30; echo done > $out" {};
}
`

// store is a chroot store with the test derivations instantiated.
type store struct {
	dir  string
	env  []string
	drvs map[string]string
}

func newStore(t *testing.T) *store {
	t.Helper()
	n := nixtest.New(t)
	s := &store{dir: n.Store, env: append(append(os.Environ(), n.Env...), "NIX_CONFIG="+strings.Join(nixtest.Config, "\n")), drvs: map[string]string{}}
	expr := filepath.Join(n.WorkDir, "test.nix")
	if err := os.WriteFile(expr, []byte(testExpr), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hello", "greet", "broken", "sleepy"} {
		cmd := exec.Command("nix-instantiate", "--store", s.dir, expr, "-A", name)
		cmd.Env = s.env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("nix-instantiate %s: %v", name, err)
		}
		s.drvs[name] = strings.TrimSpace(string(out))
	}
	return s
}

// client speaks to `nix-daemon --stdio` on the store.
func (s *store) client(t *testing.T) *daemon.Client {
	c := daemon.New(daemon.Command("nix-daemon", []string{"--stdio", "--store", s.dir}, s.env, nil), daemon.Options{})
	t.Cleanup(func() { c.Close() })
	return c
}

// socketClient starts a nix-daemon of its own for the store on a Unix
// socket (the real daemon, as the system runs it, minus systemd) and
// speaks to it there.
func (s *store) socketClient(t *testing.T) *daemon.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "socket")
	cmd := exec.Command("nix-daemon", "--store", s.dir)
	cmd.Env = append(slices.Clone(s.env), "NIX_DAEMON_SOCKET_PATH="+sock)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon made no socket: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := daemon.New(daemon.Socket(sock), daemon.Options{MaxConns: 2})
	t.Cleanup(func() { c.Close() })
	return c
}

// transports are the two ways the worker reaches a daemon; every
// operation is tested over both.
var transports = []struct {
	name   string
	client func(*store, *testing.T) *daemon.Client
}{
	{"stdio", (*store).client},
	{"socket", (*store).socketClient},
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// build builds a derivation's outputs and returns its result.
func build(t *testing.T, c *daemon.Client, drv string, opts daemon.BuildOptions) daemon.BuildResult {
	t.Helper()
	results, err := c.BuildPaths(testContext(t), []string{drv + "!*"}, opts)
	if err != nil {
		t.Fatalf("building %s: %v", drv, err)
	}
	if len(results) != 1 {
		t.Fatalf("%d results", len(results))
	}
	return results[0]
}

// lines collects log lines.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) logger() *daemon.Logger {
	return &daemon.Logger{Line: func(s string) { l.mu.Lock(); l.l = append(l.l, s); l.mu.Unlock() }}
}

func (l *lines) all() []string { l.mu.Lock(); defer l.mu.Unlock(); return slices.Clone(l.l) }

func TestDaemonOperations(t *testing.T) {
	nixtest.Require(t, "nix-daemon")
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { testOperations(t, tr.client) })
	}
}

func testOperations(t *testing.T, client func(*store, *testing.T) *daemon.Client) {
	s := newStore(t)
	c := client(s, t)
	ctx := testContext(t)

	hs, err := c.Handshake(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hs.Version < daemon.MinVersion || hs.NixVersion == "" {
		t.Fatalf("handshake %+v", hs)
	}

	// A build streams its log and names its outputs.
	var log lines
	res := build(t, c, s.drvs["hello"], daemon.BuildOptions{Log: log.logger()})
	if !res.Success() || res.Status != daemon.StatusBuilt {
		t.Fatalf("result %+v", res)
	}
	out := res.Outputs["out"]
	if !strings.HasPrefix(out, "/nix/store/") || !strings.HasSuffix(out, "-hello") {
		t.Fatalf("outputs %v", res.Outputs)
	}
	if got := log.all(); !slices.Contains(got, "building hello") || !slices.Contains(got, "line two") {
		t.Errorf("log %q", got)
	}
	if again := build(t, c, s.drvs["hello"], daemon.BuildOptions{}); again.Status != daemon.StatusAlreadyValid {
		t.Errorf("second build %+v", again)
	}

	// Queries.
	missing := "/nix/store/00000000000000000000000000000000-missing"
	if ok, err := c.IsValidPath(ctx, out); err != nil || !ok {
		t.Errorf("IsValidPath(out) = %v, %v", ok, err)
	}
	if ok, err := c.IsValidPath(ctx, missing); err != nil || ok {
		t.Errorf("IsValidPath(missing) = %v, %v", ok, err)
	}
	if valid, err := c.QueryValidPaths(ctx, []string{out, missing, s.drvs["hello"]}); err != nil || len(valid) != 2 || slices.Contains(valid, missing) {
		t.Errorf("QueryValidPaths = %v, %v", valid, err)
	}
	info, err := c.QueryPathInfo(ctx, out)
	if err != nil || info == nil {
		t.Fatalf("QueryPathInfo = %v, %v", info, err)
	}
	if info.Deriver != s.drvs["hello"] || !info.Ultimate || info.NarSize == 0 || len(info.References) != 0 {
		t.Errorf("info %+v", info)
	}
	if info, err := c.QueryPathInfo(ctx, missing); err != nil || info != nil {
		t.Errorf("QueryPathInfo(missing) = %v, %v", info, err)
	}
	infos, err := c.QueryPathInfos(ctx, []string{s.drvs["hello"], missing, out})
	if err != nil || infos[0] == nil || infos[1] != nil || infos[2] == nil || infos[2].NarSize != info.NarSize {
		t.Errorf("QueryPathInfos = %v, %v", infos, err)
	}
	m, err := c.QueryMissing(ctx, []string{s.drvs["greet"] + "!*", missing})
	if err != nil || !slices.Equal(m.WillBuild, []string{s.drvs["greet"]}) || !slices.Equal(m.Unknown, []string{missing}) {
		t.Errorf("QueryMissing = %+v, %v", m, err)
	}

	// NAR export: exactly the NAR, whose hash the store recorded.
	var nar bytes.Buffer
	n, err := c.NarFromPath(ctx, out, &nar)
	if err != nil || n != int64(info.NarSize) || int64(nar.Len()) != n {
		t.Fatalf("NarFromPath = %d, %v (%d bytes)", n, err, nar.Len())
	}
	if sum := sha256.Sum256(nar.Bytes()); !bytes.Equal(sum[:], info.NarHash) {
		t.Errorf("NAR hash %x, store says %x", sum, info.NarHash)
	}
	if _, err := c.NarFromPath(ctx, missing, io.Discard); !errors.Is(err, daemon.ErrNotValid) || errors.Is(err, daemon.ErrConnection) {
		t.Errorf("NarFromPath(missing) = %v", err)
	}
	var de *daemon.Error

	// NAR import into another store; a wrong hash is refused.
	other := client(newStore(t), t)
	wrong := daemon.Import{Path: out, Deriver: info.Deriver, NarHash: make([]byte, 32), NarSize: info.NarSize}
	err = other.AddToStoreNar(ctx, wrong, bytes.NewReader(nar.Bytes()), true)
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "hash mismatch") {
		t.Fatalf("import with a wrong hash: %v", err)
	}
	if ok, _ := other.IsValidPath(ctx, out); ok {
		t.Fatal("the path with a wrong hash became valid")
	}
	good := daemon.Import{Path: out, Deriver: info.Deriver, NarHash: info.NarHash, NarSize: info.NarSize, References: info.References}
	if err := other.AddToStoreNar(ctx, good, bytes.NewReader(nar.Bytes()), true); err != nil {
		t.Fatalf("import: %v", err)
	}
	if got, err := other.QueryPathInfo(ctx, out); err != nil || got == nil || !bytes.Equal(got.NarHash, info.NarHash) || got.Ultimate {
		t.Errorf("imported info %+v, %v", got, err)
	}
	// A NAR cut short never becomes valid, and the client recovers.
	short := daemon.Import{Path: s.drvs["hello"], NarHash: infos[0].NarHash, NarSize: infos[0].NarSize}
	if err := other.AddToStoreNar(ctx, short, io.MultiReader(bytes.NewReader(nar.Bytes()[:8]), errReader{}), true); err == nil {
		t.Error("an import whose NAR failed succeeded")
	}
	if ok, err := other.IsValidPath(ctx, out); err != nil || !ok {
		t.Errorf("after a failed import: %v, %v", ok, err)
	}

	// GC roots.
	if err := c.AddTempRoot(ctx, out); err != nil {
		t.Errorf("AddTempRoot: %v", err)
	}
	link := filepath.Join(t.TempDir(), "root")
	if err := os.Symlink(out, link); err != nil {
		t.Fatal(err)
	}
	if err := c.AddIndirectRoot(ctx, link); err != nil {
		t.Errorf("AddIndirectRoot: %v", err)
	}
	autoDir := filepath.Join(s.dir, "nix/var/nix/gcroots/auto")
	entries, _ := os.ReadDir(autoDir)
	found := false
	for _, e := range entries {
		if target, _ := os.Readlink(filepath.Join(autoDir, e.Name())); target == link {
			found = true
		}
	}
	if !found {
		t.Errorf("no auto root points to %s (%d entries)", link, len(entries))
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("the NAR stream broke") }

func TestDaemonBuildFailures(t *testing.T) {
	nixtest.Require(t, "nix-daemon")
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { testBuildFailures(t, tr.client) })
	}
}

func testBuildFailures(t *testing.T, client func(*store, *testing.T) *daemon.Client) {
	s := newStore(t)
	c := client(s, t)

	t.Run("permanent", func(t *testing.T) {
		var log lines
		res := build(t, c, s.drvs["broken"], daemon.BuildOptions{Log: log.logger()})
		if res.Status != daemon.StatusPermanentFailure || !strings.Contains(res.ErrorMsg, "exit code 3") {
			t.Errorf("result %+v", res)
		}
		if !slices.Contains(log.all(), "oops-this-fails") {
			t.Errorf("log %q", log.all())
		}
	})
	t.Run("timeout", func(t *testing.T) {
		res := build(t, c, s.drvs["sleepy"], daemon.BuildOptions{Timeout: time.Second})
		if res.Status != daemon.StatusTimedOut || strings.Contains(res.ErrorMsg, "silence") {
			t.Errorf("result %+v", res)
		}
	})
	t.Run("max-silent", func(t *testing.T) {
		res := build(t, c, s.drvs["sleepy"], daemon.BuildOptions{MaxSilent: time.Second})
		if res.Status != daemon.StatusTimedOut || !strings.Contains(res.ErrorMsg, "silence") {
			t.Errorf("result %+v", res)
		}
	})
	t.Run("no limit after a limited build", func(t *testing.T) {
		// Each build sets its own limits: the timeout above is gone.
		res := build(t, c, s.drvs["hello"], daemon.BuildOptions{})
		if !res.Success() {
			t.Errorf("result %+v", res)
		}
	})
	t.Run("missing derivation", func(t *testing.T) {
		results, err := c.BuildPaths(testContext(t), []string{"/nix/store/00000000000000000000000000000000-missing.drv!*"}, daemon.BuildOptions{})
		if err != nil || len(results) != 1 || results[0].Success() || !strings.Contains(results[0].ErrorMsg, "cannot build missing derivation") {
			t.Errorf("got %+v, %v", results, err)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(testContext(t))
		time.AfterFunc(500*time.Millisecond, cancel)
		_, err := c.BuildPaths(ctx, []string{s.drvs["sleepy"] + "!*"}, daemon.BuildOptions{})
		if !errors.Is(err, daemon.ErrConnection) || !errors.Is(err, context.Canceled) {
			t.Errorf("got %v", err)
		}
		// The client goes on with a new connection.
		if ok, err := c.IsValidPath(testContext(t), s.drvs["sleepy"]); err != nil || !ok {
			t.Errorf("after cancel: %v, %v", ok, err)
		}
	})
}

// The client's build hook is the one builds run with: it runs, declines,
// and the daemon builds locally.
func TestBuildHook(t *testing.T) {
	nixtest.Require(t, "nix-daemon")
	s := newStore(t)
	dir := t.TempDir()
	ran := filepath.Join(dir, "ran")
	hook := filepath.Join(dir, "hook")
	script := "#!/bin/sh\necho \"$@\" >> " + ran + "\necho '# decline-permanently' >&2\nexec cat >/dev/null\n"
	if err := os.WriteFile(hook, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c := daemon.New(daemon.Command("nix-daemon", []string{"--stdio", "--store", s.dir}, s.env, nil), daemon.Options{BuildHook: hook})
	defer c.Close()
	for _, drv := range []string{s.drvs["hello"], s.drvs["greet"]} {
		if res := build(t, c, drv, daemon.BuildOptions{}); !res.Success() {
			t.Fatalf("result %+v", res)
		}
	}
	// Once per build operation (the daemon's worker asks its hook once).
	if b, err := os.ReadFile(ran); err != nil || strings.Count(string(b), "\n") != 2 {
		t.Errorf("the hook ran %q, %v; want twice", b, err)
	}
}

// stdioDaemons dials a `nix-daemon --stdio` child of the store per
// connection and remembers them, so a test can count and kill them.
type stdioDaemons struct {
	s        *store
	mu       sync.Mutex
	children []*exec.Cmd
}

func (d *stdioDaemons) dial(context.Context) (io.ReadWriteCloser, error) {
	cmd := exec.Command("nix-daemon", "--stdio", "--store", d.s.dir)
	cmd.Env = d.s.env
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.children = append(d.children, cmd)
	d.mu.Unlock()
	return pipes{stdout, stdin}, nil
}

func (d *stdioDaemons) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.children)
}

// killAll kills every daemon dialed so far: gone at once, as in a crash.
func (d *stdioDaemons) killAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, cmd := range d.children {
		cmd.Process.Kill()
	}
}

// TestReconnect: a daemon that goes away between operations is replaced
// by a new connection; one that goes away during an operation fails it
// with ErrConnection.
func TestReconnect(t *testing.T) {
	nixtest.Require(t, "nix-daemon")
	s := newStore(t)
	daemons := &stdioDaemons{s: s}
	c := daemon.New(daemons.dial, daemon.Options{MaxConns: 1})
	defer c.Close()
	ctx := testContext(t)
	killAll := daemons.killAll
	if ok, err := c.IsValidPath(ctx, s.drvs["hello"]); err != nil || !ok {
		t.Fatal(ok, err)
	}
	killAll()
	if ok, err := c.IsValidPath(ctx, s.drvs["hello"]); err != nil || !ok {
		t.Fatalf("after the daemon went away: %v, %v", ok, err)
	}
	time.AfterFunc(time.Second, killAll)
	_, err := c.BuildPaths(ctx, []string{s.drvs["sleepy"] + "!*"}, daemon.BuildOptions{})
	if !errors.Is(err, daemon.ErrConnection) {
		t.Fatalf("build on a daemon that went away: %v", err)
	}
	if ok, err := c.IsValidPath(ctx, s.drvs["hello"]); err != nil || !ok {
		t.Fatalf("after the daemon went away mid-build: %v, %v", ok, err)
	}
	if dialed := daemons.count(); dialed != 3 {
		t.Errorf("%d connections, want 3", dialed)
	}
}

// A connection that fails takes the idle ones with it: they were most
// likely served by the same daemon, and the next operation on one may be
// one that cannot be retried (here NarFromPath).
func TestFailedConnectionDropsIdleOnes(t *testing.T) {
	nixtest.Require(t, "nix-daemon")
	s := newStore(t)
	daemons := &stdioDaemons{s: s}
	c := daemon.New(daemons.dial, daemon.Options{MaxConns: 2})
	defer c.Close()
	ctx := testContext(t)
	built := make(chan error, 1)
	sleeping := make(chan struct{})
	var once sync.Once
	log := &daemon.Logger{Line: func(string) { once.Do(func() { close(sleeping) }) }}
	go func() {
		_, err := c.BuildPaths(ctx, []string{s.drvs["sleepy"] + "!*"}, daemon.BuildOptions{Log: log})
		built <- err
	}()
	<-sleeping
	// A second connection, idle once this returns, while the build holds the first.
	for {
		if ok, err := c.IsValidPath(ctx, s.drvs["hello"]); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if daemons.count() == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	daemons.killAll()
	if err := <-built; !errors.Is(err, daemon.ErrConnection) {
		t.Fatalf("build on a daemon that went away: %v", err)
	}
	var nar bytes.Buffer
	if _, err := c.NarFromPath(ctx, s.drvs["hello"], &nar); err != nil || nar.Len() == 0 {
		t.Fatalf("NarFromPath after the daemons went away: %v", err)
	}
}

// TestSocketDaemonConcurrency: operations at once on the socket daemon
// take connections of their own.
func TestSocketDaemonConcurrency(t *testing.T) {
	nixtest.Require(t, "nix-daemon")
	s := newStore(t)
	c := s.socketClient(t)
	ctx := testContext(t)
	res := build(t, c, s.drvs["greet"], daemon.BuildOptions{})
	if !res.Success() || res.Outputs["out"] == "" {
		t.Fatalf("result %+v", res)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			infos, err := c.QueryPathInfos(ctx, []string{res.Outputs["out"], s.drvs["greet"]})
			if err == nil && (infos[0] == nil || len(infos[0].References) != 1) {
				err = errors.New("wrong path info")
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

type pipes struct {
	io.ReadCloser
	w io.WriteCloser
}

func (p pipes) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p pipes) Close() error                { p.w.Close(); return p.ReadCloser.Close() }

// benchClient is a stdio daemon on a store holding a built path (hello's
// output) and greet's .drv, not built.
func benchClient(b *testing.B) (c *daemon.Client, helloOut, greetDrv string) {
	nixtest.Require(b, "nix-daemon")
	n := nixtest.New(b)
	env := append(append(os.Environ(), n.Env...), "NIX_CONFIG="+strings.Join(nixtest.Config, "\n"))
	expr := filepath.Join(n.WorkDir, "test.nix")
	os.WriteFile(expr, []byte(testExpr), 0o644)
	cmd := exec.Command("nix-instantiate", "--store", n.Store, expr, "-A", "hello", "-A", "greet")
	cmd.Env = env
	out, err := cmd.Output()
	drvs := strings.Fields(string(out))
	if err != nil || len(drvs) != 2 {
		b.Fatal(string(out), err)
	}
	c = daemon.New(daemon.Command("nix-daemon", []string{"--stdio", "--store", n.Store}, env, nil), daemon.Options{})
	b.Cleanup(func() { c.Close() })
	results, err := c.BuildPaths(b.Context(), []string{drvs[0] + "!*"}, daemon.BuildOptions{})
	if err != nil || len(results) != 1 || !results[0].Success() {
		b.Fatal(results, err)
	}
	return c, results[0].Outputs["out"], drvs[1]
}

func BenchmarkQueryPathInfo(b *testing.B) {
	c, out, _ := benchClient(b)
	b.ReportAllocs()
	for b.Loop() {
		if info, err := c.QueryPathInfo(b.Context(), out); err != nil || info == nil {
			b.Fatal(info, err)
		}
	}
}

func BenchmarkNarFromPath(b *testing.B) {
	c, out, _ := benchClient(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.NarFromPath(b.Context(), out, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrefetchCheck compares two ways to learn what a job must pull
// before building greet (its input hello's output is valid, greet's is
// not): QueryValidPaths of the wanted paths, which the worker uses, and
// QueryMissing of greet's outputs, which walks the derivation's closure
// and names derivations to build, not paths to pull.
func BenchmarkPrefetchCheck(b *testing.B) {
	c, helloOut, greetDrv := benchClient(b)
	b.Run("QueryValidPaths", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if valid, err := c.QueryValidPaths(b.Context(), []string{greetDrv, helloOut}); err != nil || len(valid) != 2 {
				b.Fatal(valid, err)
			}
		}
	})
	b.Run("QueryMissing", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if m, err := c.QueryMissing(b.Context(), []string{greetDrv + "!*"}); err != nil || !slices.Equal(m.WillBuild, []string{greetDrv}) {
				b.Fatal(m, err)
			}
		}
	})
}
