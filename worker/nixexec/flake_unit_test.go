package nixexec

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/wire"
)

// testCommit is a well-formed commit hash for jobs of the fake store.
const testCommit = "0123456789abcdef0123456789abcdef01234567"

func fetchJob() *wire.FlakeJob {
	return &wire.FlakeJob{
		Steps:  []wire.FlakeStep{wire.FlakeStepFetchFlake},
		Source: &wire.FlakeSourceRepository{URL: "https://example.org/repo.git", Commit: testCommit},
	}
}

func (h *harness) setupFetch() (source string, inputs []string) {
	source = sp("source")
	inputs = []string{sp("input-a"), sp("input-b"), sp("input-c")}
	h.store.fetched = &nix.FetchedFlake{SourcePath: source, InputPaths: inputs}
	h.store.refs[inputs[0]] = []string{inputs[1]}
	return source, inputs
}

// FetchResult follows the uploads of the source and every input not yet
// cached; a path the Push query reports cached is not uploaded.
func TestUnitFetchUploadsBeforeFetchResult(t *testing.T) {
	h := newHarness(t)
	source, inputs := h.setupFetch()
	h.cache.put(inputs[1]) // already cached

	if err := h.run(context.Background(), fetchJob()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	ups := h.rec.updates()
	if len(ups) != 2 {
		t.Fatalf("updates = %#v, want Fetching, FetchResult", ups)
	}
	if _, ok := ups[0].(*wire.JobUpdateFetching); !ok {
		t.Errorf("first update = %#v, want Fetching", ups[0])
	}
	fr, ok := ups[1].(*wire.JobUpdateFetchResult)
	if !ok || fr.FlakeSource == nil || *fr.FlakeSource != source {
		t.Fatalf("second update = %#v, want FetchResult{%s}", ups[1], source)
	}
	fetchIdx := h.index(func(e event) bool { return e.kind == "fetch" })
	if f := h.rec.of("fetch"); len(f) != 1 || f[0].paths[0] != "https://example.org/repo.git" || f[0].paths[1] != testCommit {
		t.Errorf("FetchFlake calls = %v", f)
	}
	resultIdx := h.index(func(e event) bool { _, ok := e.update.(*wire.JobUpdateFetchResult); return ok })
	want := []string{source, inputs[0], inputs[2]}
	got := h.rec.uploadedPaths()
	if !sameSet(got, want) {
		t.Errorf("uploaded %v, want %v", got, want)
	}
	for _, p := range want {
		i := h.index(isUploadOf(p))
		if i < fetchIdx || i > resultIdx {
			t.Errorf("upload of %s at event %d, not between FetchFlake (%d) and FetchResult (%d)", p, i, fetchIdx, resultIdx)
		}
	}
	// The upload carries the NAR from DumpPath and the path's references.
	for _, e := range h.rec.of("upload") {
		if string(e.data) != string(narOf(e.paths[0])) {
			t.Errorf("upload of %s carried %q", e.paths[0], e.data)
		}
	}
	for _, u := range h.rec.of("upload") {
		if u.paths[0] == inputs[0] && !reflect.DeepEqual(u.meta.References, []string{inputs[1]}) {
			t.Errorf("upload meta references of %s = %v", inputs[0], u.meta.References)
		}
	}
	// One Push query named every path.
	qs := h.rec.of("query")
	if len(qs) != 1 || qs[0].mode != wire.QueryPush || !sameSet(qs[0].paths, append([]string{source}, inputs...)) {
		t.Errorf("queries = %+v, want one Push query for source and inputs", qs)
	}
}

// A failed Push query counts every path as uncached.
func TestUnitFetchPushQueryErrorUploadsEverything(t *testing.T) {
	h := newHarness(t)
	source, inputs := h.setupFetch()
	h.cache.put(inputs[1])
	h.cache.pushErr = errors.New("query went wrong")

	if err := h.run(context.Background(), fetchJob()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got, want := h.rec.uploadedPaths(), append([]string{source}, inputs...); !sameSet(got, want) {
		t.Errorf("uploaded %v, want %v", got, want)
	}
	if _, ok := h.rec.updates()[1].(*wire.JobUpdateFetchResult); !ok {
		t.Errorf("no FetchResult after the uploads: %#v", h.rec.updates())
	}
}

// An upload failure fails the job as Transient, without FetchResult.
func TestUnitFetchUploadErrorIsTransient(t *testing.T) {
	h := newHarness(t)
	_, inputs := h.setupFetch()
	h.cache.uploadErr[inputs[2]] = errors.New("disk full on the server")

	err := h.run(context.Background(), fetchJob())
	jobError(t, err, wire.FailureTransient)
	for _, u := range h.rec.updates() {
		if _, ok := u.(*wire.JobUpdateFetchResult); ok {
			t.Errorf("FetchResult sent although an upload failed")
		}
	}
}

// A failed fetch is Permanent and nothing is uploaded.
func TestUnitFetchFailureIsPermanent(t *testing.T) {
	h := newHarness(t)
	h.store.fetchEr = errors.New("no such commit")
	err := h.run(context.Background(), fetchJob())
	jobError(t, err, wire.FailurePermanent)
	if n := len(h.rec.of("upload")); n != 0 {
		t.Errorf("%d uploads after a failed fetch", n)
	}
}

// ---- evaluation ----

// evalGraph builds a derivation graph: root "top" depends on n leaves
// (each with its own source and a shared source) and on a known
// derivation (whose own input must not be walked).
type evalGraph struct {
	top, known, knownChild string
	leaves                 []string
	shared                 string
	srcOf                  map[string]string
}

func (h *harness) setupEval(n int) *evalGraph {
	g := &evalGraph{top: sp("top.drv"), known: sp("known.drv"), knownChild: sp("known-child.drv"), shared: sp("shared-src"), srcOf: map[string]string{}}
	h.store.setValid(g.shared)
	topInputs := map[string][]string{g.known: {"out"}}
	for i := range n {
		leaf := sp(fmt.Sprintf("leaf-%03d.drv", i))
		src := sp(fmt.Sprintf("leaf-src-%03d", i))
		g.leaves = append(g.leaves, leaf)
		g.srcOf[leaf] = src
		topInputs[leaf] = []string{"out"}
		h.store.addDrv(&nix.Derivation{Path: leaf, Name: "leaf", System: "x86_64-linux",
			Outputs:   map[string]nix.DerivationOutput{"out": {Path: sp(fmt.Sprintf("leaf-%03d", i))}},
			InputSrcs: []string{g.shared, src}, InputDrvs: map[string][]string{}, Env: map[string]string{"name": "leaf"}})
		h.store.setValid(leaf, src)
	}
	h.store.addDrv(&nix.Derivation{Path: g.top, System: "x86_64-linux",
		Outputs:   map[string]nix.DerivationOutput{"out": {Path: sp("top")}},
		InputSrcs: []string{g.shared}, InputDrvs: topInputs, Env: map[string]string{"name": "top-1.0"}})
	h.store.addDrv(&nix.Derivation{Path: g.known, System: "x86_64-linux",
		Outputs:   map[string]nix.DerivationOutput{"out": {Path: sp("known")}},
		InputDrvs: map[string][]string{g.knownChild: {"out"}}, Env: map[string]string{}})
	h.store.addDrv(&nix.Derivation{Path: g.knownChild, System: "x86_64-linux",
		Outputs: map[string]nix.DerivationOutput{"out": {Path: sp("known-child")}}, Env: map[string]string{}})
	h.store.setValid(g.top, g.known, g.knownChild)
	h.cache.known[g.known] = true
	return g
}

func evalJob(source string) *wire.FlakeJob {
	return &wire.FlakeJob{
		Steps:     []wire.FlakeStep{wire.FlakeStepEvaluateFlake, wire.FlakeStepEvaluateDerivations},
		Source:    &wire.FlakeSourceCached{StorePath: source},
		Wildcards: []string{"packages.x86_64-linux.*"},
	}
}

func evalResults(h *harness) (idx []int, res []*wire.JobUpdateEvalResult) {
	for i, e := range h.rec.all() {
		if r, ok := e.update.(*wire.JobUpdateEvalResult); ok {
			idx = append(idx, i)
			res = append(res, r)
		}
	}
	return idx, res
}

// A walk of more than one batch: every EvalResult follows the uploads of
// its .drv files and sources, each path is uploaded once, known
// derivations are pruned but kept as dependencies, attribute errors
// become EvalMessages and the final EvalResult carries Unmatched.
func TestUnitEvaluateBatchesUploadsAndPruning(t *testing.T) {
	h := newHarness(t)
	source := sp("flake-source")
	h.store.setValid(source)
	g := h.setupEval(70)
	h.store.eval = &nix.Evaluation{
		Derivations: []nix.FoundDerivation{
			{Attr: "packages.x86_64-linux.alias", DrvPath: g.top},
			{Attr: "packages.x86_64-linux.top", DrvPath: g.top},
		},
		AttrErrors: map[string]string{"packages.x86_64-linux.zbroken": "error: z", "packages.x86_64-linux.abroken": "error: a"},
		Unmatched:  []string{"target 'packages.x86_64-linux.nope' matched no derivations in the flake"},
	}

	if err := h.run(context.Background(), evalJob(source)); err != nil {
		t.Fatalf("Run: %v", err)
	}

	// The source was valid: nothing pulled; evaluated as path:<source>.
	if n := len(h.rec.of("pull")); n != 0 {
		t.Errorf("%d pulls, want none", n)
	}
	attrs := h.rec.of("attrs")
	if len(attrs) != 1 || !reflect.DeepEqual(attrs[0].paths, []string{"path:" + source, "packages.x86_64-linux.*"}) {
		t.Errorf("Attributes calls = %v", attrs)
	}
	ups := h.rec.updates()
	if _, ok := ups[0].(*wire.JobUpdateEvaluatingFlake); !ok {
		t.Errorf("first update %#v, want EvaluatingFlake", ups[0])
	}
	if _, ok := ups[1].(*wire.JobUpdateEvaluatingDerivations); !ok {
		t.Errorf("second update %#v, want EvaluatingDerivations", ups[1])
	}

	// Attribute errors, sorted by attribute.
	var msgs []*wire.EvalMessage
	for _, e := range h.rec.of("send") {
		if m, ok := e.msg.(*wire.EvalMessage); ok {
			msgs = append(msgs, m)
		}
	}
	wantMsgs := []*wire.EvalMessage{
		{JobID: "job-1", Level: wire.EvalLevelError, Source: "nix-eval:packages.x86_64-linux.abroken", Message: "error: a"},
		{JobID: "job-1", Level: wire.EvalLevelError, Source: "nix-eval:packages.x86_64-linux.zbroken", Message: "error: z"},
	}
	if !reflect.DeepEqual(msgs, wantMsgs) {
		t.Errorf("EvalMessages = %+v, want %+v", msgs, wantMsgs)
	}

	idx, res := evalResults(h)
	if len(res) < 2 {
		t.Fatalf("%d EvalResults, want at least 2 (71 derivations, batches of %d)", len(res), evalBatch)
	}
	seen := map[string]int{}
	for i, r := range res {
		final := i == len(res)-1
		if !final && len(r.Derivations) != evalBatch {
			t.Errorf("EvalResult %d has %d derivations, want %d", i, len(r.Derivations), evalBatch)
		}
		if !final && (len(r.Errors) != 0 || r.Errors == nil || r.Warnings == nil) {
			t.Errorf("intermediate EvalResult %d errors %#v warnings %#v, want empty lists", i, r.Errors, r.Warnings)
		}
		for _, d := range r.Derivations {
			seen[d.DrvPath]++
			for _, p := range append([]string{d.DrvPath}, d.InputSources...) {
				u := h.index(isUploadOf(p))
				if u < 0 || u > idx[i] {
					t.Errorf("EvalResult %d (event %d) reports %s but %s was uploaded at event %d", i, idx[i], d.DrvPath, p, u)
				}
			}
		}
	}
	final := res[len(res)-1]
	if !reflect.DeepEqual(final.Errors, h.store.eval.Unmatched) {
		t.Errorf("final EvalResult errors = %v, want %v", final.Errors, h.store.eval.Unmatched)
	}
	if final.Warnings == nil {
		t.Errorf("final EvalResult warnings nil, want []")
	}
	for i, e := range h.rec.all() {
		if e.kind == "upload" && i > idx[len(idx)-1] {
			t.Errorf("upload of %s after the final EvalResult", e.paths[0])
		}
	}

	// Every walked derivation exactly once; the known one and its input never.
	want := append([]string{g.top}, g.leaves...)
	if len(seen) != len(want) {
		t.Errorf("reported %d derivations, want %d", len(seen), len(want))
	}
	for _, p := range want {
		if seen[p] != 1 {
			t.Errorf("%s reported %d times, want once", p, seen[p])
		}
	}
	for _, p := range []string{g.known, g.knownChild} {
		if seen[p] != 0 {
			t.Errorf("known-pruned %s was reported", p)
		}
		for _, e := range h.rec.of("derivations") {
			if slices.Contains(e.paths, p) {
				t.Errorf("known-pruned %s was parsed", p)
			}
		}
		if h.index(isUploadOf(p)) >= 0 {
			t.Errorf("known-pruned %s was uploaded", p)
		}
	}
	var known []string
	for _, e := range h.rec.of("known") {
		known = append(known, e.paths...)
	}
	if !slices.Contains(known, g.known) {
		t.Errorf("KnownDerivations never asked about %s (asked %v)", g.known, known)
	}
	// The root: named by its first attribute, listing the known dependency.
	for _, r := range res {
		for _, d := range r.Derivations {
			if d.DrvPath == g.top {
				if d.Attr != "packages.x86_64-linux.alias" {
					t.Errorf("top attr = %q, want the first attribute naming it", d.Attr)
				}
				if !slices.Contains(d.Dependencies, g.known) || len(d.Dependencies) != 71 || !slices.IsSorted(d.Dependencies) {
					t.Errorf("top dependencies (%d) lack the known derivation or are unsorted", len(d.Dependencies))
				}
			} else if d.Attr != "" {
				t.Errorf("dependency %s has attr %q, want empty", d.DrvPath, d.Attr)
			}
		}
	}

	// Each path uploaded at most once per evaluation (the shared source is
	// an input of every derivation).
	counts := map[string]int{}
	for _, p := range h.rec.uploadedPaths() {
		counts[p]++
	}
	for p, n := range counts {
		if n != 1 {
			t.Errorf("%s uploaded %d times", p, n)
		}
	}
	if counts[g.shared] != 1 {
		t.Errorf("shared source uploaded %d times, want 1", counts[g.shared])
	}
	for _, leaf := range g.leaves {
		if counts[leaf] != 1 || counts[g.srcOf[leaf]] != 1 {
			t.Errorf("%s or its source not uploaded", leaf)
		}
	}
}

// A failed KnownDerivations query counts as none known: everything is walked.
func TestUnitEvaluateKnownQueryFailureWalksAll(t *testing.T) {
	h := newHarness(t)
	source := sp("flake-source")
	h.store.setValid(source)
	g := h.setupEval(3)
	h.cache.knownErr = errors.New("server busy")
	h.store.eval = &nix.Evaluation{Derivations: []nix.FoundDerivation{{Attr: "packages.x86_64-linux.top", DrvPath: g.top}}}

	if err := h.run(context.Background(), evalJob(source)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	_, res := evalResults(h)
	if len(res) != 1 {
		t.Fatalf("%d EvalResults, want 1", len(res))
	}
	var got []string
	for _, d := range res[0].Derivations {
		got = append(got, d.DrvPath)
	}
	want := append([]string{g.top, g.known, g.knownChild}, g.leaves...)
	if !sameSet(got, want) {
		t.Errorf("reported %v, want %v", got, want)
	}
	if res[0].Errors == nil || len(res[0].Errors) != 0 {
		t.Errorf("final errors = %#v, want []", res[0].Errors)
	}
}

// An upload failure during the walk fails the evaluation as Transient and
// no EvalResult reports the batch.
func TestUnitEvaluateUploadErrorIsTransient(t *testing.T) {
	h := newHarness(t)
	source := sp("flake-source")
	h.store.setValid(source)
	g := h.setupEval(60)
	h.store.eval = &nix.Evaluation{Derivations: []nix.FoundDerivation{{Attr: "packages.x86_64-linux.top", DrvPath: g.top}}}
	h.cache.uploadErr[g.leaves[10]] = errors.New("upload broke")

	err := h.run(context.Background(), evalJob(source))
	jobError(t, err, wire.FailureTransient)
	_, res := evalResults(h)
	for _, r := range res {
		for _, d := range r.Derivations {
			if d.DrvPath == g.leaves[10] {
				t.Errorf("%s reported although its upload failed", d.DrvPath)
			}
		}
	}
}

// A cached source not valid locally is pulled before evaluating, then its
// locked inputs (a worker that may not fetch has no credentials for them).
func TestUnitEvaluatePullsCachedSource(t *testing.T) {
	h := newHarness(t)
	source, input := sp("flake-source"), sp("input-source")
	h.cache.put(source)
	h.cache.put(input)
	h.store.lockedInputs = []string{input}
	h.store.eval = &nix.Evaluation{}
	if err := h.run(context.Background(), evalJob(source)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	imps := h.rec.of("import")
	if len(imps) != 2 || len(imps[0].imp) != 1 || imps[0].imp[0].StorePath != source ||
		len(imps[1].imp) != 1 || imps[1].imp[0].StorePath != input {
		t.Fatalf("imports = %+v, want the source, then its input", imps)
	}
	if in := h.rec.of("inputs"); len(in) != 1 || in[0].paths[0] != "path:"+source {
		t.Fatalf("locked inputs asked of %+v, want the pulled source", in)
	}
	if a := h.index(func(e event) bool { return e.kind == "attrs" }); a < h.index(func(e event) bool { return e.kind == "import" }) {
		t.Errorf("evaluated before the source was imported")
	}
	_, res := evalResults(h)
	if len(res) != 1 || len(res[0].Derivations) != 0 || res[0].Errors == nil {
		t.Errorf("EvalResults = %+v, want one empty final result", res)
	}
}

// The DiscoveredDerivation fields come from the .drv (docs/protocol/worker.md §6.3).
func TestUnitDiscoveredDerivationFields(t *testing.T) {
	h := newHarness(t)
	source := sp("flake-source")
	h.store.setValid(source)
	drv := sp("hello-2.12.drv")
	depA, depB := sp("dep-a.drv"), sp("dep-b.drv")
	srcA, srcB := sp("zz-src"), sp("aa-src")
	h.store.addDrv(&nix.Derivation{
		Path: drv, Name: "hello-2.12", System: "aarch64-linux",
		Outputs: map[string]nix.DerivationOutput{
			"out": {Path: sp("hello-2.12")}, "dev": {Path: sp("hello-2.12-dev")}, "bin": {Path: sp("hello-2.12-bin")},
			"floating": {Path: ""},
		},
		InputSrcs: []string{srcA, srcB},
		InputDrvs: map[string][]string{depB: {"out"}, depA: {"out", "dev"}},
		Env: map[string]string{"name": "hello-2.12", "requiredSystemFeatures": "kvm  big-parallel",
			"timeout": "3600", "maxSilent": "600", "preferLocalBuild": "1", "allowSubstitutes": ""},
	})
	fod := sp("fetch.drv")
	h.store.addDrv(&nix.Derivation{
		Path: fod, System: "x86_64-linux",
		Outputs: map[string]nix.DerivationOutput{"out": {Path: sp("fetch"), HashAlgo: "sha256", Hash: "00"}},
		Env:     map[string]string{"__json": `{"pname":"fetcher","requiredSystemFeatures":["x"],"timeout":5,"name":"fetch-1"}`},
	})
	h.store.setValid(drv, fod, srcA, srcB)
	h.cache.known[depA] = true
	h.cache.known[depB] = true
	h.store.eval = &nix.Evaluation{Derivations: []nix.FoundDerivation{
		{Attr: "packages.aarch64-linux.hello", DrvPath: drv},
		{Attr: "packages.aarch64-linux.fetch", DrvPath: fod},
	}}

	if err := h.run(context.Background(), evalJob(source)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	_, res := evalResults(h)
	if len(res) != 1 || len(res[0].Derivations) != 2 {
		t.Fatalf("EvalResults = %+v", res)
	}
	byPath := map[string]wire.DiscoveredDerivation{}
	for _, d := range res[0].Derivations {
		byPath[d.DrvPath] = d
	}
	u := func(v uint64) *uint64 { return &v }
	s := func(v string) *string { return &v }
	want := wire.DiscoveredDerivation{
		Attr: "packages.aarch64-linux.hello", DrvPath: drv,
		Outputs: []wire.DerivationOutput{
			{Name: "bin", Path: sp("hello-2.12-bin")}, {Name: "dev", Path: sp("hello-2.12-dev")}, {Name: "out", Path: sp("hello-2.12")},
		},
		Dependencies:     sortedCopy([]string{depA, depB}),
		InputSources:     sortedCopy([]string{srcA, srcB}),
		Architecture:     "aarch64-linux",
		RequiredFeatures: []string{"kvm", "big-parallel"},
		TimeoutSecs:      u(3600), MaxSilentSecs: u(600),
		PreferLocalBuild: true, IsFixedOutput: false, AllowSubstitutes: false,
		Pname: s("hello"),
	}
	if got := byPath[drv]; !reflect.DeepEqual(got, want) {
		t.Errorf("hello:\n got %+v\nwant %+v", got, want)
	}
	wantFod := wire.DiscoveredDerivation{
		Attr: "packages.aarch64-linux.fetch", DrvPath: fod,
		Outputs:      []wire.DerivationOutput{{Name: "out", Path: sp("fetch")}},
		Dependencies: []string{}, InputSources: []string{},
		Architecture: "x86_64-linux", RequiredFeatures: []string{"x"},
		TimeoutSecs: u(5), IsFixedOutput: true, AllowSubstitutes: true,
		Pname: s("fetcher"),
	}
	if got := byPath[fod]; !reflect.DeepEqual(got, wantFod) {
		t.Errorf("fetch:\n got %+v\nwant %+v", got, wantFod)
	}
}

func sameSet(a, b []string) bool {
	return reflect.DeepEqual(sortedCopy(a), sortedCopy(b))
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	if c == nil {
		c = []string{}
	}
	return c
}

// Locked inputs the cache lacks are left to Nix: the evaluation goes on.
func TestUnitEvaluateWithInputsNotCached(t *testing.T) {
	h := newHarness(t)
	source := sp("flake-source")
	h.cache.put(source)
	h.store.lockedInputs = []string{sp("public-input")}
	h.store.eval = &nix.Evaluation{}
	if err := h.run(context.Background(), evalJob(source)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(h.rec.of("attrs")) != 1 {
		t.Fatal("the flake was not evaluated")
	}
}

// Batches upload concurrently: while the first batch's upload of the top
// derivation is held, a later batch's uploads start; the EvalResults still
// come in walk order, each after the uploads of its own paths.
func TestUnitEvaluateBatchesUploadConcurrently(t *testing.T) {
	h := newHarness(t)
	source := sp("flake-source")
	h.store.setValid(source)
	g := h.setupEval(200) // batches: top and 49 leaves, then 50, 50, 50, and the last leaf
	h.store.eval = &nix.Evaluation{Derivations: []nix.FoundDerivation{{Attr: "packages.x86_64-linux.top", DrvPath: g.top}}}
	later := g.leaves[120] // in the fourth batch
	laterStarted := make(chan struct{})
	var once sync.Once
	overlapped := false
	h.cache.onUpload = func(path string) {
		switch path {
		case later:
			once.Do(func() { close(laterStarted) })
		case g.top:
			select {
			case <-laterStarted:
				overlapped = true
			case <-time.After(10 * time.Second): // one batch at a time: never
			}
		}
	}
	if err := h.run(context.Background(), evalJob(source)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !overlapped {
		t.Fatal("a later batch's uploads did not start while the first batch's were held")
	}
	idx, res := evalResults(h)
	if len(res) != 5 {
		t.Fatalf("%d EvalResults, want 5", len(res))
	}
	if res[0].Derivations[0].DrvPath != g.top {
		t.Errorf("first EvalResult starts with %s, want the top derivation", res[0].Derivations[0].DrvPath)
	}
	uploadedAt := map[string]int{}
	for i, e := range h.rec.all() {
		if e.kind == "upload" {
			uploadedAt[e.paths[0]] = i
		}
	}
	var prev string
	for i, r := range res {
		for _, d := range r.Derivations {
			if at, ok := uploadedAt[d.DrvPath]; !ok || at > idx[i] {
				t.Errorf("EvalResult %d reports %s before its upload", i, d.DrvPath)
			}
			if d.DrvPath != g.top && d.DrvPath < prev {
				t.Errorf("EvalResult %d: %s after %s, not in walk order", i, d.DrvPath, prev)
			}
			if d.DrvPath != g.top {
				prev = d.DrvPath
			}
		}
	}
}
