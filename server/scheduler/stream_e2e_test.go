package scheduler_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
)

// Builds stream while the evaluation goes on (real Nix): one attribute's
// evaluation blocks on a FIFO the test holds, so the evaluation cannot
// end; the quick attribute's build is assigned and built meanwhile. Once
// the FIFO is written, the evaluation ends and builds the rest.
func TestBuildStartsBeforeTheEvaluationEnds(t *testing.T) {
	w := newWorld(t, storagetest.SQLiteURL(t), 1)
	fifo := filepath.Join(t.TempDir(), "gate")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": fmt.Sprintf(`{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: extra: builtins.derivation ({ inherit name system; builder = "/bin/sh"; args = [ "-c" "echo ${name} > $out" ]; } // extra);
  in {
    packages.${system} = {
      quick = step "quick" {};
      # evaluating it reads the FIFO: it waits for the test
      slow = step "slow" { gate = builtins.readFile %q; };
    };
  };
}`, fifo)})
	ev := w.evaluate("packages.x86_64-linux.*")
	_, builds := w.waitFor(ev.ID, "quick built while evaluating", 2*time.Minute, func(e storage.Evaluation, bs []storage.Build) bool {
		if e.Status.Terminal() {
			t.Fatalf("evaluation ended (%s: %s) with its slow attribute still blocked", e.Status, e.Error)
		}
		return byAttr(bs)["quick"].Status == storage.BuildSucceeded
	})
	if got, err := jobqueue.New(w.db).Evaluation(t.Context(), ev.ID); err != nil || got.Status.Terminal() || got.Status == storage.EvaluationBuilding {
		t.Fatalf("evaluation %+v, %v; want it still evaluating", got, err)
	}
	if _, ok := byAttr(builds)["slow"]; ok {
		t.Fatal("slow's build exists before its evaluation")
	}
	// Let slow's evaluation finish.
	gate, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	gate.WriteString("open\n")
	gate.Close()
	end, builds := w.waitDone(ev.ID)
	if end.Status != storage.EvaluationSucceeded {
		t.Fatalf("evaluation %s: %s", end.Status, end.Error)
	}
	for _, name := range []string{"quick", "slow"} {
		if b := byAttr(builds)[name]; b.Status != storage.BuildSucceeded {
			t.Errorf("build %s: %s", name, b.Status)
		}
	}
}
