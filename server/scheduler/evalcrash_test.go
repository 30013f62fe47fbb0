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
	"gradient.dev/gradient/storage/jobqueue"
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
	open, err := jobqueue.New(w.db).OpenAssignments(t.Context())
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

// releaseGate writes the FIFO once for every reader that has it open
// (blocked in open or read); false when there is none.
func releaseGate(fifo string) bool {
	fd, err := syscall.Open(fifo, syscall.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false // ENXIO: no reader
	}
	syscall.Write(fd, []byte("open\n"))
	syscall.Close(fd)
	return true
}

// newGate makes the FIFO; whatever the test's end, no Nix process (the
// killed worker's included) stays blocked on it.
func newGate(t *testing.T) string {
	fifo := filepath.Join(t.TempDir(), "gate")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 10 {
			if !releaseGate(fifo) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return fifo
}

// openGate keeps releasing the FIFO's readers until stop is called.
func openGate(t *testing.T, fifo string) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
				releaseGate(fifo)
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

// uninterruptedDerivations evaluates the gated flake at repo and commit
// in a world of its own (a second evaluation in the same world would
// skip what the first built) and returns the derivations of its builds.
func uninterruptedDerivations(t *testing.T, repo, commit, fifo string) map[string]bool {
	t.Helper()
	ref := newWorld(t, storagetest.SQLiteURL(t), 0)
	ref.repo, ref.commit = repo, commit
	ref.startWorker()
	stop := openGate(t, fifo)
	defer stop()
	end, builds := ref.waitDone(ref.evaluate("packages.x86_64-linux.*").ID)
	if end.Status != storage.EvaluationSucceeded {
		t.Fatalf("uninterrupted evaluation: %s (%s)", end.Status, end.Error)
	}
	drvs := map[string]bool{}
	for _, b := range builds {
		drvs[b.DrvPath] = true
	}
	return drvs
}

// untilMidEvaluation is waitFor's condition for the gated flake: the n
// quick attributes' EvalResults are stored as builds while the
// evaluation waits on zz.
func untilMidEvaluation(t *testing.T, n int) func(storage.Evaluation, []storage.Build) bool {
	return func(e storage.Evaluation, bs []storage.Build) bool {
		if e.Status.Terminal() || e.Status == storage.EvaluationBuilding {
			t.Fatalf("evaluation %s (%s) with zz still blocked", e.Status, e.Error)
		}
		if _, ok := byAttr(bs)["zz"]; ok {
			t.Fatal("zz's build exists before its evaluation")
		}
		return len(bs) >= n
	}
}

// checkResumedEvaluation: the interrupted evaluation of the gated flake
// (n quick attributes) succeeded with every build stored before the kill
// still there (same row, same derivation), no derivation or attribute
// twice, every build succeeded, and the derivations want of an
// uninterrupted evaluation.
func checkResumedEvaluation(t *testing.T, n int, acked []storage.Build, end storage.Evaluation, builds []storage.Build, want map[string]bool) {
	t.Helper()
	if end.Status != storage.EvaluationSucceeded {
		t.Fatalf("evaluation after the kill: %s (%s)", end.Status, end.Error)
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

// TestWorkerKilledMidEvaluation: kill -9 of the only worker (a real
// gradient-worker process) while its evaluation is blocked in Nix, after
// EvalResult batches have been stored as builds. A new worker process
// with the same ID takes the evaluation over and ends it as
// checkResumedEvaluation says.
func TestWorkerKilledMidEvaluation(t *testing.T) {
	nixtest.Require(t, "nix", "git")
	const n = 60
	fifo := newGate(t)
	w := newWorld(t, storagetest.SQLiteURL(t), 0)
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": gatedFlake(n, fifo)})
	want := uninterruptedDerivations(t, w.repo, w.commit, fifo)

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
	_, acked := w.waitFor(ev.ID, "the quick attributes' builds stored mid-evaluation", 2*time.Minute, untilMidEvaluation(t, n))
	victim.kill()

	openGate(t, fifo)
	startWorker()
	end, builds := w.waitDone(ev.ID)
	checkResumedEvaluation(t, n, acked, end, builds, want)
}

// TestServerKilledMidEvaluation: kill -9 of the server process while the
// evaluation is blocked in Nix, after EvalResult batches have been stored
// as builds. The restarted server queues the evaluation again; the
// workers, reconnected, end it as checkResumedEvaluation says.
func TestServerKilledMidEvaluation(t *testing.T) {
	nixtest.Require(t, "nix", "git")
	const n = 60
	fifo := newGate(t)
	dbURL := storagetest.PostgresURL(t)
	w := crashWorld(t, dbURL)
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": gatedFlake(n, fifo)})
	want := uninterruptedDerivations(t, w.repo, w.commit, fifo)

	addr := freeAddr(t)
	w.url = "ws://" + addr + "/proto"
	serverArgs := []string{"--listen", addr, "--database", dbURL, "--nar-dir", t.TempDir(), "--poll-interval", "0", "--log-level", "info"}
	srv := start(t, nil, "gradient-server", serverArgs...)
	waitHealthy(t, addr)
	w.startWorker()
	w.startWorker()

	ev := w.createEvaluation("packages.x86_64-linux.*")
	_, acked := w.waitFor(ev.ID, "the quick attributes' builds stored mid-evaluation", 2*time.Minute, untilMidEvaluation(t, n))
	srv.kill()

	openGate(t, fifo)
	start(t, nil, "gradient-server", serverArgs...)
	waitHealthy(t, addr)
	end, builds := w.waitDone(ev.ID)
	checkResumedEvaluation(t, n, acked, end, builds, want)
}
