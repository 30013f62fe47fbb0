package scheduler_test

import (
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// wideFlake has n independent trivial derivations: an evaluation whose
// .drv uploads take a while.
func wideFlake(n int) string {
	return fmt.Sprintf(`{
  outputs = { self }: let
    system = "x86_64-linux";
    mk = i: builtins.derivation { name = "w${toString i}"; inherit system; builder = "/bin/sh";
      args = [ "-c" "echo ${toString i} > $out" ]; };
  in { packages.${system} = builtins.listToAttrs (builtins.genList (i: { name = "w${toString i}"; value = mk i; }) %d); };
}
`, n)
}

// TestServerKilledDuringEvaluationUploads: kill -9 of the server while an
// evaluation uploads its .drv files (committed in groups). Every path the
// server recorded before the kill is still recorded afterwards with its
// NAR object whole (never a narinfo without its NAR); the restarted
// server re-queues the evaluation, which finishes with one build per
// derivation, each built once.
func TestServerKilledDuringEvaluationUploads(t *testing.T) {
	nixtest.Require(t, "nix", "git")
	const n = 300
	dbURL := storagetest.PostgresURL(t)
	w := crashWorld(t, dbURL)
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": wideFlake(n)})
	addr := freeAddr(t)
	w.url = "ws://" + addr + "/proto"
	narDir := t.TempDir()
	serverArgs := []string{"--listen", addr, "--database", dbURL, "--nar-dir", narDir, "--poll-interval", "0", "--log-level", "info"}
	srv := start(t, nil, "gradient-server", serverArgs...)
	waitHealthy(t, addr)
	w.startWorker()
	w.startWorker()

	ev := w.createEvaluation("packages.x86_64-linux.*")
	drvs := func() int {
		paths, err := w.db.ListCachePaths(t.Context(), w.cache.ID)
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for _, p := range paths {
			if strings.HasSuffix(p.StorePath, ".drv") {
				count++
			}
		}
		return count
	}
	waitfor.Within(t, 2*time.Minute, "the evaluation's first .drv uploads", func() bool { return drvs() >= 20 })
	srv.kill()

	// What the server acknowledged: every row recorded before it died.
	acked, err := w.db.ListCachePaths(t.Context(), w.cache.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := drvs(); got >= n {
		t.Logf("the kill came after all %d .drv uploads; the restart is still checked", got)
	}
	store, err := narstore.OpenLocal(narDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range acked {
		checkObject(t, store, p)
	}
	start(t, nil, "gradient-server", serverArgs...)
	waitHealthy(t, addr)

	ev, builds := w.waitDone(ev.ID)
	if ev.Status != storage.EvaluationSucceeded {
		t.Fatalf("evaluation after the server was killed: %s (%s)", ev.Status, ev.Error)
	}
	if len(builds) != n {
		t.Fatalf("%d builds, want %d (one per derivation)", len(builds), n)
	}
	seen := map[string]bool{}
	for _, b := range builds {
		if seen[b.DrvPath] {
			t.Errorf("%s has two builds", b.DrvPath)
		}
		seen[b.DrvPath] = true
		if b.Status != storage.BuildSucceeded {
			t.Errorf("build %s: %s (%s)", b.Attr, b.Status, b.Error)
		}
	}
	after, err := w.db.ListCachePaths(t.Context(), w.cache.ID)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]storage.CachePath{}
	for _, p := range after {
		have[p.StorePath] = p
	}
	for _, p := range acked {
		if q, ok := have[p.StorePath]; !ok || q.FileHash != p.FileHash {
			t.Errorf("%s was recorded before the kill and is gone or changed after it", p.StorePath)
		}
	}
	for _, p := range after {
		checkObject(t, store, p)
	}
	open, err := w.db.OpenAssignments(t.Context())
	if err != nil || len(open) != 0 {
		t.Errorf("open assignments after the evaluation ended: %+v, %v", open, err)
	}
}

// checkObject reads a recorded path's NAR object and checks its hash.
func checkObject(t *testing.T, store *narstore.Local, p storage.CachePath) {
	t.Helper()
	rc, size, err := store.Open(t.Context(), p.ObjectKey)
	if err != nil {
		t.Fatalf("%s is recorded but its object %s is not stored: %v", p.StorePath, p.ObjectKey, err)
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		t.Fatal(err)
	}
	if got := "sha256:" + nixbase32.Encode(h.Sum(nil)); got != p.FileHash || size != p.FileSize {
		t.Fatalf("%s: object %s has hash %s and %d bytes, the row says %s and %d", p.StorePath, p.ObjectKey, got, size, p.FileHash, p.FileSize)
	}
}

// gatedFlake has n quick attributes q0…q(n-1) on a shared input dep, and
// zz, whose evaluation first reads the FIFO gate: the evaluation cannot
// end until the test writes it. The bytes read do not enter zz's
// derivation, so every evaluation yields the same derivations.
func gatedFlake(n int, gate string) string {
	return fmt.Sprintf(`{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
    dep = step "dep" "echo dep > $out";
    mk = i: step "q${toString i}" "read v < ${dep}; echo ${toString i} $v > $out";
  in { packages.${system} = builtins.listToAttrs (builtins.genList (i: { name = "q${toString i}"; value = mk i; }) %d) // {
    zz = builtins.seq (builtins.readFile %q) (step "zz" "read v < ${dep}; echo zz $v > $out");
  }; };
}
`, n, gate)
}

// openGate writes the FIFO for every reader that has it open, until stop
// is closed (a reader of the killed worker's evaluation may still hold
// it: it is let go too).
func openGate(t *testing.T, fifo string) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	write := func() bool {
		fd, err := syscall.Open(fifo, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return false // ENXIO: no reader yet
		}
		syscall.Write(fd, []byte("open\n"))
		syscall.Close(fd)
		return true
	}
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
				write()
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			<-finished
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestWorkerKilledMidEvaluation: kill -9 of the only worker (a real
// gradient-worker process) while its evaluation is blocked in Nix, after
// EvalResult batches have been stored as builds. A new worker process
// with the same ID takes the evaluation over; it ends with every build
// stored before the kill still there (same row, same derivation), no
// derivation or attribute twice, and the same derivations as an
// uninterrupted evaluation of the same commit.
func TestWorkerKilledMidEvaluation(t *testing.T) {
	nixtest.Require(t, "nix", "git")
	const n = 60
	w := newWorld(t, storagetest.SQLiteURL(t), 0)
	fifo := filepath.Join(t.TempDir(), "gate")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// Whatever the test's end, no Nix process stays blocked on the gate.
	t.Cleanup(func() {
		for range 10 {
			fd, err := syscall.Open(fifo, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				return
			}
			syscall.Write(fd, []byte("open\n"))
			syscall.Close(fd)
			time.Sleep(50 * time.Millisecond)
		}
	})
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": gatedFlake(n, fifo)})

	// The derivations of an uninterrupted evaluation of the same commit,
	// in a world of its own (here the second evaluation would skip what
	// the first built).
	ref := newWorld(t, storagetest.SQLiteURL(t), 0)
	ref.repo, ref.commit = w.repo, w.commit
	ref.startWorker()
	stopGate := openGate(t, fifo)
	refEnd, refBuilds := ref.waitDone(ref.evaluate("packages.x86_64-linux.*").ID)
	stopGate()
	if refEnd.Status != storage.EvaluationSucceeded {
		t.Fatalf("uninterrupted evaluation: %s (%s)", refEnd.Status, refEnd.Error)
	}
	want := map[string]bool{}
	for _, b := range refBuilds {
		want[b.DrvPath] = true
	}

	id, peers := testworld.Register(t, w.db, w.project.ID)
	startWorker := func() *process {
		n := nixtest.New(t)
		env := append(n.Env, "NIX_CONFIG="+strings.Join(append(nixtest.Config, "store = "+n.Store), "\n"))
		return start(t, env, "gradient-worker", "--server-url", w.url, "--peers", peers,
			"--base-dir", t.TempDir(), "--id", id, "--trusted-public-keys", w.cache.PublicKey(),
			"--capabilities-fetch", "--capabilities-eval", "--capabilities-build",
			"--allow-local-repositories") // the world's repository is local
	}
	victim := startWorker()

	ev := w.evaluate("packages.x86_64-linux.*")
	// Evidence of mid-evaluation: the quick attributes' EvalResults are
	// stored as builds while the evaluation waits on zz.
	_, acked := w.waitFor(ev.ID, "the quick attributes' builds stored mid-evaluation", 2*time.Minute, func(e storage.Evaluation, bs []storage.Build) bool {
		if e.Status.Terminal() || e.Status == storage.EvaluationBuilding {
			t.Fatalf("evaluation %s (%s) with zz still blocked", e.Status, e.Error)
		}
		return len(bs) >= n
	})
	if _, ok := byAttr(acked)["zz"]; ok {
		t.Fatal("zz's build exists before its evaluation")
	}
	victim.kill()

	openGate(t, fifo)
	startWorker()
	end, builds := w.waitDone(ev.ID)
	if end.Status != storage.EvaluationSucceeded {
		t.Fatalf("evaluation after the worker was killed: %s (%s)", end.Status, end.Error)
	}
	byID := map[string]storage.Build{}
	drvs, attrs := map[string]bool{}, map[string]bool{}
	for _, b := range builds {
		byID[b.ID] = b
		if drvs[b.DrvPath] {
			t.Errorf("%s has two builds", b.DrvPath)
		}
		drvs[b.DrvPath] = true
		if b.Attr != "" {
			if attrs[b.Attr] {
				t.Errorf("attribute %s has two builds", b.Attr)
			}
			attrs[b.Attr] = true
		}
		if b.Status != storage.BuildSucceeded {
			t.Errorf("build %s (%s): %s (%s)", b.Attr, b.DrvPath, b.Status, b.Error)
		}
	}
	for _, a := range acked {
		if b, ok := byID[a.ID]; !ok || b.DrvPath != a.DrvPath || b.Attr != a.Attr {
			t.Errorf("build %s of %s (%s), stored before the kill, is gone or changed: %+v", a.ID, a.Attr, a.DrvPath, b)
		}
	}
	if len(attrs) != n+1 {
		t.Errorf("%d attributes built, want %d", len(attrs), n+1)
	}

	if !maps.Equal(drvs, want) {
		t.Errorf("the interrupted evaluation has %d derivations, an uninterrupted one %d: %v vs %v",
			len(drvs), len(want), slices.Sorted(maps.Keys(drvs)), slices.Sorted(maps.Keys(want)))
	}
	t.Logf("%d builds stored before the kill, %d after; %d derivations", len(acked), len(builds), len(drvs))
}
