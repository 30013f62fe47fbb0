package scheduler_test

import (
	"crypto/sha256"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
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
