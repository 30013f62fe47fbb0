package scheduler_test

import (
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// The cache scopes a job's uploads by what it produces: the scheduler
// names a held build job's outputs and project, lets a flake job upload
// content-addressed paths, and tells other sessions nothing.
func TestJobProductsOfHeldJobs(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	one := leaf("one")
	e.evaluate(one)
	w := e.worker([]string{e.project}, allCaps, x86)
	other := e.worker([]string{e.project}, allCaps, x86)
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := w.mustAssigned("build")
	p, ok := e.sched.JobProducts(w.live, a.JobID)
	if !ok || p.Project != e.project || !slices.Equal(p.Outputs, []string{one.Outputs[0].Path}) || p.ContentAddressed ||
		!strings.Contains(p.What, one.DrvPath) {
		t.Errorf("products of a held build = %+v, %v; want project %s, outputs of %s only", p, ok, e.project, one.DrvPath)
	}
	if _, ok := e.sched.JobProducts(other.live, a.JobID); ok {
		t.Error("another session was told the products of a job it does not hold")
	}
	if _, ok := e.sched.JobProducts(w.live, "no-such-job"); ok {
		t.Error("a job nobody holds has products")
	}

	if _, err := e.sched.StartEvaluation(t.Context(), storage.NewEvaluation{ProjectID: e.project, RepositoryURL: "https://example.invalid/p.git", Commit: "def"}); err != nil {
		t.Fatal(err)
	}
	evaluator := e.worker([]string{e.project}, wire.GradientCapabilities{Fetch: true, Eval: true}, nil)
	evaluator.send(&wire.RequestJob{Kind: wire.JobKindFlake})
	f := evaluator.mustAssigned("flake job")
	if p, ok := e.sched.JobProducts(evaluator.live, f.JobID); !ok || p.Project != e.project || !p.ContentAddressed || len(p.Outputs) != 0 {
		t.Errorf("products of a held flake job = %+v, %v; want content-addressed paths of project %s", p, ok, e.project)
	}
}
