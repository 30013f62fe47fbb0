package nix

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/nixbase32"
)

const testSystemAttrs = "packages.x86_64-linux."

func TestFetchEvaluateAndWalk(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	ref, fetched := fetchedTestFlake(t, n)
	if len(fetched.InputPaths) != 0 {
		t.Errorf("a flake without inputs has input paths %v", fetched.InputPaths)
	}
	if valid, err := n.ValidPaths(ctx, fetched.SourcePath); err != nil || len(valid) != 1 {
		t.Fatalf("fetched source %s not valid: %v %v", fetched.SourcePath, valid, err)
	}

	eval, err := n.Attributes(ctx, ref, []string{
		"packages.x86_64-linux.*, checks.#.hello",
		"packages.x86_64-linux.missing",
		"!packages.x86_64-linux.sleepy",
	})
	if err != nil {
		t.Fatal(err)
	}
	var attrs []string
	for _, d := range eval.Derivations {
		attrs = append(attrs, d.Attr)
		if !strings.HasSuffix(d.DrvPath, ".drv") {
			t.Errorf("%s: drvPath %q", d.Attr, d.DrvPath)
		}
	}
	want := []string{"checks.x86_64-linux.hello", "packages.x86_64-linux.broken", "packages.x86_64-linux.greet", "packages.x86_64-linux.hello", "packages.x86_64-linux.kvm"}
	if !slices.Equal(attrs, want) {
		t.Errorf("matched %v, want %v", attrs, want)
	}
	if msg := eval.AttrErrors["packages.x86_64-linux.bad"]; !strings.Contains(msg, "bad attribute") || len(eval.AttrErrors) != 1 {
		t.Errorf("attribute errors %v, want bad's throw message", eval.AttrErrors)
	}
	if len(eval.Unmatched) != 1 || !strings.Contains(eval.Unmatched[0], "'packages.x86_64-linux.missing' matched no derivations") {
		t.Errorf("unmatched %v", eval.Unmatched)
	}

	greetDrv, err := n.Instantiate(ctx, ref, testSystemAttrs+"greet")
	if err != nil {
		t.Fatal(err)
	}
	helloDrv, _ := n.Instantiate(ctx, ref, testSystemAttrs+"hello")
	greet, err := n.Derivation(ctx, greetDrv)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := greet.InputDrvs[helloDrv]; !ok || greet.System != "x86_64-linux" || greet.OutputPaths()["out"] == "" {
		t.Errorf("greet derivation: %+v", greet)
	}
	drvs, sources, err := n.DrvClosure(ctx, greetDrv)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{greetDrv, helloDrv}; !slices.Equal(drvs, sortedCopy(want)) || len(sources) != 0 {
		t.Errorf("closure %v + %v, want %v", drvs, sources, want)
	}

	if _, err := n.Instantiate(ctx, ref, testSystemAttrs+"bad"); err == nil || !strings.Contains(err.Error(), "bad attribute") {
		t.Errorf("instantiating a throwing attribute: %v", err)
	}
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestDerivationAttributes(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	ref := testRepoRef(t)
	drvPath, err := n.Instantiate(ctx, ref, testSystemAttrs+"kvm")
	if err != nil {
		t.Fatal(err)
	}
	d, err := n.Derivation(ctx, drvPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.RequiredSystemFeatures(); !slices.Equal(got, []string{"kvm", "big-parallel"}) {
		t.Errorf("features %v", got)
	}
	if !limitIs(d.TimeoutSecs(), 7) || !limitIs(d.MaxSilentSecs(), 5) || !d.PreferLocalBuild() || d.AllowSubstitutes() || d.Pname() != "kvm-test" || d.IsFixedOutput() {
		t.Errorf("timeout %v maxSilent %v preferLocal %v allowSubst %v pname %q fixed %v",
			d.TimeoutSecs(), d.MaxSilentSecs(), d.PreferLocalBuild(), d.AllowSubstitutes(), d.Pname(), d.IsFixedOutput())
	}
}

// testRepoRef is the test flake as a git+file reference (no fetch step).
func testRepoRef(t *testing.T) string {
	dir, commit := newTestRepo(t)
	return "git+file://" + dir + "?rev=" + commit
}

func TestBuildSuccessAndNAR(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	ref := testRepoRef(t)
	greetDrv, err := n.Instantiate(ctx, ref, testSystemAttrs+"greet")
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	outputs, err := n.Build(ctx, greetDrv, BuildOptions{LogWriter: &log, Timeout: 30 * time.Second, Cores: 1})
	if err != nil {
		t.Fatal(err)
	}
	out := outputs["out"]
	if len(outputs) != 1 || out == "" {
		t.Fatalf("outputs %v", outputs)
	}
	if !strings.Contains(log.String(), "building hello") || !strings.Contains(log.String(), "greeting") {
		t.Errorf("build log lacks builder output:\n%s", log.String())
	}
	// The builds ran with the decline hook, not Nix's own.
	if b, err := os.ReadFile(filepath.Join(n.WorkDir, buildHookName)); err != nil || string(b) != declineHookScript {
		t.Errorf("build hook %q, %v", b, err)
	}

	infos, err := n.PathInfo(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	info := infos[0]
	if info.Path != out || info.Deriver != greetDrv || len(info.References) != 1 || !strings.HasSuffix(info.References[0], "-hello-1.0") {
		t.Errorf("path info %+v", info)
	}
	var nar bytes.Buffer
	if err := n.DumpPath(ctx, out, &nar); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(nar.Bytes())
	if got := "sha256:" + nixbase32.Encode(sum[:]); got != info.NarHash || int64(nar.Len()) != info.NarSize {
		t.Errorf("dumped NAR hash %s size %d, path-info says %s %d", got, nar.Len(), info.NarHash, info.NarSize)
	}
	// nix-store --dump reads the filesystem path (chroot stores unmapped).
	legacy, err := n.output(ctx, "nix-store", "--dump", filepath.Join(n.Store, out))
	if err != nil || !bytes.Equal(legacy, nar.Bytes()) {
		t.Errorf("nix store dump-path and nix-store --dump differ (%v)", err)
	}

	if drvInfo, err := n.PathInfo(ctx, greetDrv); err != nil || drvInfo[0].Path != greetDrv || len(drvInfo[0].References) != 1 {
		t.Errorf("path info of the .drv itself: %+v %v", drvInfo, err)
	}

	missing := "/nix/store/00000000000000000000000000000000-nothing"
	if got, err := n.MissingPaths(ctx, out, missing); err != nil || !slices.Equal(got, []string{missing}) {
		t.Errorf("missing paths %v %v", got, err)
	}
	if _, err := n.PathInfo(ctx, missing); err == nil {
		t.Error("path info of an invalid path succeeded")
	}

	// The output moves to another store through a file:// binary cache.
	cache := "file://" + t.TempDir()
	if err := n.CopyTo(ctx, cache, out, greetDrv); err != nil {
		t.Fatal(err)
	}
	other := newTestNix(t)
	if err := other.CopyFrom(ctx, cache, nil, out, greetDrv); err != nil {
		t.Fatal(err)
	}
	if got, err := other.ValidPaths(ctx, out, info.References[0], greetDrv); err != nil || len(got) != 3 {
		t.Errorf("after CopyFrom valid %v %v", got, err)
	}
}

func TestBuildFailures(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	ref := testRepoRef(t)
	drv := func(attr string) string {
		p, err := n.Instantiate(ctx, ref, testSystemAttrs+attr)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	broken, sleepy := drv("broken"), drv("sleepy")

	t.Run("permanent", func(t *testing.T) {
		_, err := n.Build(ctx, broken, BuildOptions{})
		var perm *PermanentError
		if !errors.As(err, &perm) || !strings.Contains(perm.LogTail, "oops-this-fails") || !strings.Contains(perm.Message, "exit code 3") {
			t.Fatalf("got %#v", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		_, err := n.Build(ctx, sleepy, BuildOptions{Timeout: time.Second})
		var timeout *TimeoutError
		if !errors.As(err, &timeout) || timeout.Silence || !strings.Contains(timeout.LogTail, "sleeping") {
			t.Fatalf("got %#v", err)
		}
	})
	t.Run("max-silent", func(t *testing.T) {
		_, err := n.Build(ctx, sleepy, BuildOptions{MaxSilent: time.Second})
		var timeout *TimeoutError
		if !errors.As(err, &timeout) || !timeout.Silence {
			t.Fatalf("got %#v", err)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(500*time.Millisecond, cancel)
		start := time.Now()
		_, err := n.Build(cctx, sleepy, BuildOptions{})
		if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
		if took := time.Since(start); took > 15*time.Second {
			t.Errorf("cancel took %v", took)
		}
	})
	t.Run("inputs unavailable", func(t *testing.T) {
		missing := "/nix/store/00000000000000000000000000000000-missing.drv"
		_, err := n.Build(ctx, missing, BuildOptions{})
		var unavailable *InputsUnavailableError
		if !errors.As(err, &unavailable) || !slices.Equal(unavailable.MissingPaths, []string{missing}) {
			t.Fatalf("got %#v", err)
		}
	})
}

// A build killed by SIGKILL, what the kernel's OOM killer sends, is
// Transient (docs/protocol/jobs.md §10: the reference's signature "killed"): another
// attempt, maybe on a worker with more memory, may succeed.
func TestBuildKilledBySignalIsTransient(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	ref := testRepoRef(t)
	build := func(attr string, started func()) error {
		drv, err := n.Instantiate(ctx, ref, "killed.x86_64-linux."+attr)
		if err != nil {
			t.Fatal(err)
		}
		log := &lineWatch{want: "allocating", seen: make(chan struct{})}
		done := make(chan error, 1)
		go func() {
			_, err := n.Build(ctx, drv, BuildOptions{LogWriter: log})
			done <- err
		}()
		if started != nil {
			select {
			case <-log.seen:
				started()
			case err := <-done:
				t.Fatalf("%s ended before it was killed: %v", attr, err)
			}
		}
		return <-done
	}
	for attr, started := range map[string]func(){
		"builder": func() {
			if !killBuilder(t, n.Store, "# oom-target") {
				t.Fatal("no builder of the test store found")
			}
		},
		"child": nil, // it kills its own child
	} {
		err := build(attr, started)
		var transient *TransientError
		if !errors.As(err, &transient) || !strings.Contains(strings.ToLower(transient.Message), "killed") {
			t.Errorf("%s killed by signal 9: %#v, want a TransientError", attr, err)
		}
	}
}

// lineWatch closes seen once want appears in what is written to it.
type lineWatch struct {
	mu   sync.Mutex
	buf  []byte
	want string
	seen chan struct{}
	once sync.Once
}

func (l *lineWatch) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if bytes.Contains(l.buf, []byte(l.want)) {
		l.once.Do(func() { close(l.seen) })
	}
	return len(p), nil
}

// killBuilder sends SIGKILL, from outside the build's namespace as the
// kernel's OOM killer does, to the sh builder (Nix runs /bin/sh as "sh") whose script holds
// marker and that descends from a process naming store (its daemon).
func killBuilder(t *testing.T, store, marker string) bool {
	t.Helper()
	parentOf := func(pid int) int {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if i := bytes.LastIndexByte(stat, ')'); err == nil && i > 0 {
			// pid (comm) state ppid …: comm may hold spaces.
			if fields := strings.Fields(string(stat[i+1:])); len(fields) > 1 {
				ppid, _ := strconv.Atoi(fields[1])
				return ppid
			}
		}
		return 0
	}
	cmdline := func(pid int) []byte {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		return b
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil || !bytes.Contains(cmdline(pid), []byte(marker)) || !bytes.HasPrefix(cmdline(pid), []byte("sh\x00")) {
			continue
		}
		for p := parentOf(pid); p > 1; p = parentOf(p) {
			if bytes.Contains(cmdline(p), []byte(store)) {
				return syscall.Kill(pid, syscall.SIGKILL) == nil
			}
		}
	}
	return false
}

func TestSystemAndFeatures(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	system, extra, err := n.System(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := exec.Command("uname", "-m").Output(); !strings.HasPrefix(system, strings.TrimSpace(string(want))) {
		t.Errorf("system %q extra %v on %s", system, extra, want)
	}
	features, err := n.SystemFeatures(ctx)
	if err != nil || !slices.Contains(features, "big-parallel") {
		t.Errorf("features %v %v", features, err)
	}
}

// A build with BuildOptions.Nice runs its builder that much nicer than
// the worker (the daemon child that forks it is reniced first); one
// without runs at the worker's own priority.
func TestBuildNice(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	dir, commit := gitRepo(t, map[string]string{"flake.nix": `{
  outputs = { self }: let
    mk = tag: builtins.derivation { name = "nice-${tag}"; system = "x86_64-linux"; builder = "/bin/sh";
      args = [ "-c" "read -r stat < /proc/self/stat; echo \"$stat\" > $out" ]; };
  in { packages.x86_64-linux = { plain = mk "plain"; low = mk "low"; }; };
}`}, nil)
	ref := "git+file://" + dir + "?rev=" + commit
	own, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	ownNice := 20 - own // the raw system call answers 20 - nice
	niceOf := func(attr string, opts BuildOptions) int {
		t.Helper()
		drv, err := n.Instantiate(ctx, ref, "packages.x86_64-linux."+attr)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := n.Build(ctx, drv, opts)
		if err != nil {
			t.Fatal(err)
		}
		storeDir, err := n.RealStoreDir(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(storeDir, filepath.Base(outs["out"])))
		if err != nil {
			t.Fatal(err)
		}
		// Field 19 of /proc/PID/stat, counted after the command's ")".
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		v, err := strconv.Atoi(f[16])
		if err != nil {
			t.Fatalf("stat %q: %v", s, err)
		}
		return v
	}
	if got := niceOf("plain", BuildOptions{}); got != ownNice {
		t.Errorf("a build without Nice ran at nice %d, want the worker's %d", got, ownNice)
	}
	if got, want := niceOf("low", BuildOptions{Nice: 7}), min(ownNice+7, 19); got != want {
		t.Errorf("a build with Nice 7 ran at nice %d, want %d", got, want)
	}
}

// Builds hold their daemon connection for as long as they run: more of
// them than the store operations' pool has connections still run at
// once, and the worker's short store operations (an evaluation reading
// and uploading its .drv files beside streamed builds) do not wait for
// any of them to end.
func TestLongBuildsHoldUpNeitherEachOtherNorStoreQueries(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	gate := t.TempDir()
	// A chroot store builds in a namespace: let the gate in.
	n.Config = append(n.Config, "extra-sandbox-paths = "+gate)
	const builds = 6 // more than the store operations' pool (4)
	dir, commit := gitRepo(t, map[string]string{"flake.nix": `{
  outputs = { self }: let
    mk = i: builtins.derivation { name = "held-${toString i}"; system = "x86_64-linux"; builder = "/bin/sh";
      args = [ "-c" ": > ` + gate + `/started-${toString i}; while [ ! -e ` + gate + `/release ]; do /bin/sleep 0.05; done; echo ${toString i} > $out" ]; };
  in { packages.x86_64-linux = builtins.listToAttrs (builtins.genList (i: { name = "b${toString i}"; value = mk i; }) ` + strconv.Itoa(builds) + `); };
}`}, nil)
	ref := "git+file://" + dir + "?rev=" + commit
	drvs := make([]string, builds)
	for i := range drvs {
		drv, err := n.Instantiate(ctx, ref, "packages.x86_64-linux.b"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		drvs[i] = drv
	}
	errs := make(chan error, builds)
	for _, drv := range drvs {
		go func() {
			_, err := n.Build(ctx, drv, BuildOptions{})
			errs <- err
		}()
	}
	release := func() { os.WriteFile(filepath.Join(gate, "release"), nil, 0o644) }
	defer release()
	started := func() int {
		m, _ := filepath.Glob(filepath.Join(gate, "started-*"))
		return len(m)
	}
	for deadline := time.Now().Add(30 * time.Second); started() < builds; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d builds started within 30 s: the others wait for a running build's daemon connection", started(), builds)
		}
	}
	// Every build is running and holds its connection: a store query
	// still gets an answer.
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	infos, err := n.PathInfo(qctx, drvs[0])
	cancel()
	if err != nil || len(infos) != 1 {
		t.Fatalf("a store query while %d builds run: %v, want its answer at once", builds, err)
	}
	release()
	for range drvs {
		if err := <-errs; err != nil {
			t.Errorf("a build after its release: %v", err)
		}
	}
}
