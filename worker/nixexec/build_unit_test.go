package nixexec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

// buildGraph is a build target whose .drv and inputs live only in the
// cache (unless a test makes them valid):
//
//	target.drv → refs: dep.drv (as a base name), src1 (full path)
//	dep.drv    → refs: src2 (base name)
//	src2       → refs: src3 (base name, valid locally: not pulled)
//	target.drv uses dep.drv's "out" = depOut; depOut → refs: lib (valid)
type buildGraph struct {
	target, dep, src1, src2, src3, depOut, depDev, lib, out, outDoc string
}

func (h *harness) setupBuild() *buildGraph {
	g := &buildGraph{target: sp("target-1.0.drv"), dep: sp("dep.drv"), src1: sp("src1"), src2: sp("src2"), src3: sp("src3"),
		depOut: sp("dep"), depDev: sp("dep-dev"), lib: sp("lib"), out: sp("target-1.0"), outDoc: sp("target-1.0-doc")}
	h.store.addDrv(&nix.Derivation{Path: g.target, System: "x86_64-linux",
		Outputs:   map[string]nix.DerivationOutput{"out": {Path: g.out}, "doc": {Path: g.outDoc}},
		InputSrcs: []string{g.src1}, InputDrvs: map[string][]string{g.dep: {"out"}}, Env: map[string]string{}})
	h.store.addDrv(&nix.Derivation{Path: g.dep, System: "x86_64-linux",
		Outputs:   map[string]nix.DerivationOutput{"out": {Path: g.depOut}, "dev": {Path: g.depDev}},
		InputSrcs: []string{g.src2}, Env: map[string]string{}})
	h.cache.put(g.target, base(g.dep), g.src1)
	h.cache.put(g.dep, base(g.src2))
	h.cache.put(g.src1)
	h.cache.put(g.src2, base(g.src3))
	h.cache.put(g.depOut, base(g.lib), base(g.depOut)) // self-reference too
	h.cache.put(g.depDev)
	h.store.setValid(g.src3, g.lib)
	return g
}

func buildJob(specs ...wire.BuildSpec) *wire.BuildJob {
	return &wire.BuildJob{Builds: specs}
}

func spec(id, drv string) wire.BuildSpec {
	return wire.BuildSpec{BuildID: id, DrvPath: drv, Kind: wire.BuildSpecBuild}
}

func importedPaths(h *harness) [][]string {
	var out [][]string
	for _, e := range h.rec.of("import") {
		var ps []string
		for _, it := range e.imp {
			ps = append(ps, it.StorePath)
		}
		out = append(out, ps)
	}
	return out
}

// The happy path: the missing .drv closure is pulled (following
// references given as base names), then the build inputs, then the build
// runs, BuildOutput is sent and the outputs are uploaded.
func TestUnitBuildPullsClosureBuildsAndUploads(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	tm, ms := uint64(120), uint64(30)
	s := spec("b1", g.target)
	s.TimeoutSecs, s.MaxSilentSecs = &tm, &ms

	if err := h.run(context.Background(), buildJob(s)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	ups := h.rec.updates()
	if b, ok := ups[0].(*wire.JobUpdateBuilding); !ok || b.BuildID != "b1" {
		t.Fatalf("first update %#v, want Building{b1}", ups[0])
	}

	// Pulls: round 1 the .drv; round 2 its references dep.drv, src1
	// (base name resolved); round 3 src2 (src3 is valid: not pulled).
	var pulled []string
	for _, e := range h.rec.of("pull") {
		pulled = append(pulled, e.paths...)
	}
	wantPulled := []string{g.target, g.dep, g.src1, g.src2, g.depOut}
	if !sameSet(pulled, wantPulled) {
		t.Errorf("pulled %v, want %v", pulled, wantPulled)
	}
	for _, p := range []string{g.src3, g.lib, g.depDev} {
		if slices.Contains(pulled, p) {
			t.Errorf("%s pulled, but it is valid locally or not needed", p)
		}
	}
	// Every path was named by a Pull query before its pull, and imported
	// only after the paths it references that were pulled too.
	all := h.rec.all()
	for i, e := range all {
		switch e.kind {
		case "pull":
			if !slices.ContainsFunc(all[:i], func(q event) bool {
				return q.kind == "query" && q.mode == wire.QueryPull && slices.Contains(q.paths, e.paths[0])
			}) {
				t.Errorf("pull of %s not preceded by a Pull query naming it", e.paths[0])
			}
		case "import":
			for _, ref := range e.imp[0].References {
				if ref != e.imp[0].StorePath && slices.Contains(wantPulled, ref) && !slices.ContainsFunc(all[:i], func(p event) bool {
					return p.kind == "import" && p.imp[0].StorePath == ref
				}) {
					t.Errorf("%s imported before its reference %s", e.imp[0].StorePath, ref)
				}
			}
		}
	}
	// Imports: one per path; the .drv closure before the inputs.
	var imps []string
	for _, ps := range importedPaths(h) {
		imps = append(imps, ps...)
	}
	if len(imps) != 5 || !sameSet(imps[:4], []string{g.target, g.dep, g.src1, g.src2}) || imps[4] != g.depOut {
		t.Fatalf("imports = %v", imps)
	}
	// Import metadata comes from the cache entries, references as full paths.
	for _, e := range h.rec.of("import") {
		for _, it := range e.imp {
			c := h.cache.entries[it.StorePath]
			wantRefs := []string{}
			for _, r := range *c.References {
				wantRefs = append(wantRefs, fullPath(r))
			}
			if it.NarHash != *c.NarHash || it.NarSize != int64(*c.NarSize) || it.CA != *c.CA || it.Deriver != storeDir+*c.Deriver ||
				!reflect.DeepEqual(sortedCopy(it.References), sortedCopy(wantRefs)) {
				t.Errorf("import item %+v does not match cache entry %+v", it, c)
			}
			if !bytes.Equal(h.store.importedFiles[it.StorePath], fileOf(it.StorePath)) {
				t.Errorf("import of %s read %q", it.StorePath, h.store.importedFiles[it.StorePath])
			}
		}
	}
	// Build options.
	bs := h.rec.of("build")
	if len(bs) != 1 || bs[0].paths[0] != g.target {
		t.Fatalf("builds = %+v", bs)
	}
	if o := bs[0].opts; o.Timeout != 120*time.Second || o.MaxSilent != 30*time.Second || o.Cores != 3 || o.LogWriter == nil {
		t.Errorf("build options = %+v", o)
	}
	buildIdx := h.index(func(e event) bool { return e.kind == "build" })
	if last := h.index(func(e event) bool { return e.kind == "import" && e.imp[0].StorePath == g.depOut }); last > buildIdx {
		t.Errorf("inputs imported after the build started")
	}
	// Stages, BuildOutput, then the output uploads.
	var stages []wire.BuildStage
	var out *wire.JobUpdateBuildOutput
	outIdx := -1
	for i, e := range h.rec.all() {
		switch u := e.update.(type) {
		case wire.BuildStage:
			stages = append(stages, u)
		case *wire.JobUpdateBuildOutput:
			out, outIdx = u, i
		}
	}
	if !reflect.DeepEqual(stages, []wire.BuildStage{wire.BuildStagePrefetch, wire.BuildStageBuild, wire.BuildStageUpload}) {
		t.Errorf("stages = %v", stages)
	}
	if out == nil || out.BuildID != "b1" || out.Substituted || out.Metrics == nil || out.Metrics.BuildTimeMS == nil {
		t.Fatalf("BuildOutput = %+v", out)
	}
	if outIdx < buildIdx {
		t.Errorf("BuildOutput before the build")
	}
	if len(out.Outputs) != 2 || out.Outputs[0].Name != "doc" || out.Outputs[0].StorePath != g.outDoc || out.Outputs[1].Name != "out" || out.Outputs[1].StorePath != g.out {
		t.Errorf("BuildOutput outputs = %+v", out.Outputs)
	}
	for _, o := range out.Outputs {
		if o.Hash != base(o.StorePath)[:32] {
			t.Errorf("output hash %q of %s", o.Hash, o.StorePath)
		}
	}
	if got := h.rec.uploadedPaths(); !sameSet(got, []string{g.out, g.outDoc}) {
		t.Errorf("uploaded %v, want the outputs", got)
	}
	for _, p := range []string{g.out, g.outDoc} {
		if i := h.index(isUploadOf(p)); i < buildIdx {
			t.Errorf("%s uploaded before the build", p)
		}
	}
	// BuildProgress: the prefetch's tally, then the uploads, at most one a
	// second while they run and the final counts at the end.
	var prefetch, upload []*wire.BuildProgress
	for _, e := range h.rec.of("progress") {
		p := e.msg.(*wire.BuildProgress)
		if p.BuildID != "b1" {
			t.Errorf("BuildProgress of build %q", p.BuildID)
		}
		switch p.Phase {
		case wire.ProgressPrefetch:
			prefetch = append(prefetch, p)
		case wire.ProgressUpload:
			upload = append(upload, p)
		}
	}
	if len(prefetch) != 1 || prefetch[0].PathsDone == 0 || prefetch[0].PathsTotal == nil || *prefetch[0].PathsTotal != prefetch[0].PathsDone || prefetch[0].BytesDone == 0 {
		t.Errorf("prefetch progress %+v, want one final tally of what was pulled", prefetch)
	}
	if len(upload) == 0 || len(upload) > 2 {
		t.Fatalf("%d upload reports, want the first path's and the final one", len(upload))
	}
	for _, p := range upload {
		if p.PathsTotal == nil || *p.PathsTotal != 2 {
			t.Errorf("upload progress %+v, want 2 paths in all", p)
		}
	}
	if last := upload[len(upload)-1]; last.PathsDone != 2 {
		t.Errorf("last upload progress %+v, want 2 of 2 paths", last)
	}
}

// Building is the first update even when the .drv cannot be had; a
// cached:false answer fails InputsUnavailable naming the path, and
// nothing is built.
func TestUnitBuildDrvNotCachedIsInputsUnavailable(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	delete(h.cache.entries, g.target)

	err := h.run(context.Background(), buildJob(spec("b1", g.target)))
	je := jobError(t, err, wire.FailureInputsUnavailable)
	if !reflect.DeepEqual(je.MissingPaths, []string{g.target}) {
		t.Errorf("missing paths = %v, want [%s]", je.MissingPaths, g.target)
	}
	ups := h.rec.updates()
	if len(ups) == 0 {
		t.Fatal("no updates")
	}
	if b, ok := ups[0].(*wire.JobUpdateBuilding); !ok || b.BuildID != "b1" {
		t.Errorf("first update %#v, want Building{b1}", ups[0])
	}
	if n := len(h.rec.of("build")) + len(h.rec.of("pull")) + len(h.rec.of("import")); n != 0 {
		t.Errorf("%d build/pull/import calls after a cached:false answer", n)
	}
}

// A reference deep in the closure that the cache lacks is named too.
func TestUnitBuildMissingClosureReference(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	delete(h.cache.entries, g.src2)

	err := h.run(context.Background(), buildJob(spec("b1", g.target)))
	je := jobError(t, err, wire.FailureInputsUnavailable)
	if !reflect.DeepEqual(je.MissingPaths, []string{g.src2}) {
		t.Errorf("missing paths = %v, want [%s]", je.MissingPaths, g.src2)
	}
	if n := len(h.rec.of("build")); n != 0 {
		t.Errorf("built although an input is unavailable")
	}
}

// An input output missing from the cache during prefetch: InputsUnavailable,
// reported as a build-prefetch EvalMessage too, and no build.
func TestUnitBuildPrefetchInputUnavailable(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	delete(h.cache.entries, g.depOut)

	err := h.run(context.Background(), buildJob(spec("b1", g.target)))
	je := jobError(t, err, wire.FailureInputsUnavailable)
	if !reflect.DeepEqual(je.MissingPaths, []string{g.depOut}) {
		t.Errorf("missing paths = %v, want [%s]", je.MissingPaths, g.depOut)
	}
	if n := len(h.rec.of("build")); n != 0 {
		t.Errorf("built although an input is unavailable")
	}
	var msg *wire.EvalMessage
	for _, e := range h.rec.of("send") {
		if m, ok := e.msg.(*wire.EvalMessage); ok {
			msg = m
		}
	}
	if msg == nil || msg.Source != "build-prefetch" || msg.Level != wire.EvalLevelError || !strings.Contains(msg.Message, base(g.depOut)) {
		t.Errorf("EvalMessage = %+v, want a build-prefetch error naming %s", msg, g.depOut)
	}
}

// A pulled object whose bytes do not match the cache's file hash fails
// InputsUnavailable naming it; it is not imported, nothing is built.
func TestUnitBuildFileHashMismatch(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	h.cache.content[g.dep] = []byte("corrupted bytes")

	err := h.run(context.Background(), buildJob(spec("b1", g.target)))
	je := jobError(t, err, wire.FailureInputsUnavailable)
	if !reflect.DeepEqual(je.MissingPaths, []string{g.dep}) {
		t.Errorf("missing paths = %v, want [%s]", je.MissingPaths, g.dep)
	}
	if slices.Contains(slices.Concat(importedPaths(h)...), g.dep) || len(h.rec.of("build")) != 0 {
		t.Errorf("imported %v or built after a hash mismatch", importedPaths(h))
	}
}

// NarUnavailable from Pull is InputsUnavailable with its paths.
func TestUnitBuildPullNarUnavailable(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	h.cache.pullErr = &worker.NarUnavailableError{Paths: []string{g.target}, Reasons: []string{"gone"}}

	err := h.run(context.Background(), buildJob(spec("b1", g.target)))
	je := jobError(t, err, wire.FailureInputsUnavailable)
	if !reflect.DeepEqual(je.MissingPaths, []string{g.target}) {
		t.Errorf("missing paths = %v", je.MissingPaths)
	}
}

// Nix's build errors map to failure kinds; no BuildOutput, no uploads.
func TestUnitBuildErrorClassification(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		kind    wire.BuildFailureKind
		missing []string
	}{
		{"timeout", &nix.TimeoutError{Message: "timed out after 1 seconds"}, wire.FailureTimeout, nil},
		{"permanent", &nix.PermanentError{Message: "builder failed with exit code 1"}, wire.FailurePermanent, nil},
		{"transient", &nix.TransientError{Message: "no space left on device"}, wire.FailureTransient, nil},
		{"inputs", &nix.InputsUnavailableError{MissingPaths: []string{sp("gone")}, Message: "gone"}, wire.FailureInputsUnavailable, []string{sp("gone")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			g := h.setupBuild()
			h.store.build = func(ctx context.Context, drv string, opts nix.BuildOptions) (map[string]string, error) {
				return nil, tc.err
			}
			err := h.run(context.Background(), buildJob(spec("b1", g.target)))
			je := jobError(t, err, tc.kind)
			if !errors.Is(err, tc.err) {
				t.Errorf("error %v does not wrap Nix's", err)
			}
			if !reflect.DeepEqual(je.MissingPaths, tc.missing) {
				t.Errorf("missing paths = %v, want %v", je.MissingPaths, tc.missing)
			}
			for _, u := range h.rec.updates() {
				if _, ok := u.(*wire.JobUpdateBuildOutput); ok {
					t.Errorf("BuildOutput after a failed build")
				}
			}
			if n := len(h.rec.of("upload")); n != 0 {
				t.Errorf("%d uploads after a failed build", n)
			}
		})
	}
}

// Outputs already valid: BuildOutput{Substituted}, still uploaded, no build.
func TestUnitBuildOutputsAlreadyValid(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	h.store.setValid(g.target, g.out, g.outDoc)
	h.cache.put(g.outDoc) // already in the server's cache: not uploaded again

	if err := h.run(context.Background(), buildJob(spec("b1", g.target))); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := len(h.rec.of("build")); n != 0 {
		t.Errorf("Build called for valid outputs")
	}
	if n := len(h.rec.of("pull")); n != 0 {
		t.Errorf("%d pulls for a valid .drv with valid outputs", n)
	}
	var out *wire.JobUpdateBuildOutput
	for _, u := range h.rec.updates() {
		if o, ok := u.(*wire.JobUpdateBuildOutput); ok {
			out = o
		}
	}
	if out == nil || !out.Substituted || out.BuildID != "b1" || len(out.Outputs) != 2 {
		t.Fatalf("BuildOutput = %+v, want substituted with 2 outputs", out)
	}
	if got := h.rec.uploadedPaths(); !reflect.DeepEqual(got, []string{g.out}) {
		t.Errorf("uploaded %v, want [%s]", got, g.out)
	}
	if b, ok := h.rec.updates()[0].(*wire.JobUpdateBuilding); !ok || b.BuildID != "b1" {
		t.Errorf("first update %#v, want Building", h.rec.updates()[0])
	}
}

// A job reads each .drv once, however many of its builds use it: two
// builds on the same input read the input's .drv once.
func TestUnitBuildReadsEachDerivationOnce(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	other, otherOut := sp("other.drv"), sp("other")
	h.store.addDrv(&nix.Derivation{Path: other, System: "x86_64-linux", Outputs: map[string]nix.DerivationOutput{"out": {Path: otherOut}},
		InputDrvs: map[string][]string{g.dep: {"out"}}, Env: map[string]string{}})
	h.cache.put(other, base(g.dep))

	if err := h.run(context.Background(), buildJob(spec("b1", g.target), spec("b2", other))); err != nil {
		t.Fatalf("Run: %v", err)
	}
	reads := map[string]int{}
	for _, e := range h.rec.of("derivations") {
		for _, p := range e.paths {
			reads[p]++
		}
	}
	if want := map[string]int{g.target: 1, g.dep: 1, other: 1}; !reflect.DeepEqual(reads, want) {
		t.Errorf("reads per .drv %v, want %v", reads, want)
	}
	if got := h.rec.uploadedPaths(); !slices.Contains(got, otherOut) || !slices.Contains(got, g.out) {
		t.Errorf("uploaded %v, want both builds' outputs", got)
	}
}

// An output upload failure is Transient.
func TestUnitBuildOutputUploadErrorIsTransient(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	h.cache.uploadErr[g.out] = errors.New("boom")
	err := h.run(context.Background(), buildJob(spec("b1", g.target)))
	jobError(t, err, wire.FailureTransient)
}

// Build logs arrive as LogChunks of whole lines for the spec's task
// index; the trailing partial line is flushed when the build ends.
func TestUnitBuildLogLines(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	second := sp("second.drv")
	h.store.addDrv(&nix.Derivation{Path: second, System: "x86_64-linux", Outputs: map[string]nix.DerivationOutput{"out": {Path: sp("second")}}, Env: map[string]string{}})
	h.store.setValid(second)
	writes := map[string][]string{
		g.target: {"line one\nli", "ne two\nline three\npar", "tial"},
		second:   {"a", "b\n", "c\n"},
	}
	var sawPartial bool
	h.store.build = func(ctx context.Context, drv string, opts nix.BuildOptions) (map[string]string, error) {
		for _, w := range writes[drv] {
			opts.LogWriter.Write([]byte(w))
		}
		if drv == g.target {
			// Before the build returns, the partial line is held back.
			for _, e := range h.rec.of("log") {
				if bytes.Contains(e.data, []byte("par")) {
					sawPartial = true
				}
			}
		}
		h.store.mu.Lock()
		d := h.store.drvs[drv]
		h.store.mu.Unlock()
		outs := d.OutputPaths()
		for _, p := range outs {
			h.store.setValid(p)
		}
		return outs, nil
	}
	if err := h.run(context.Background(), buildJob(spec("b1", g.target), spec("b2", second))); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if sawPartial {
		t.Errorf("a partial line was sent before the build ended")
	}
	var chunks [2][]string
	for _, e := range h.rec.of("log") {
		if e.task > 1 {
			t.Fatalf("log for task %d", e.task)
		}
		if !bytes.HasSuffix(e.data, []byte("\n")) {
			t.Errorf("chunk %q is not whole lines", e.data)
		}
		chunks[e.task] = append(chunks[e.task], string(e.data))
	}
	if want := []string{"line one\n", "line two\nline three\n", "partial\n"}; !reflect.DeepEqual(chunks[0], want) {
		t.Errorf("task 0 chunks = %q, want %q", chunks[0], want)
	}
	if want := []string{"ab\n", "c\n"}; !reflect.DeepEqual(chunks[1], want) {
		t.Errorf("task 1 chunks = %q, want %q", chunks[1], want)
	}
	// Building{b2} comes after b1's outputs.
	var order []string
	for _, u := range h.rec.updates() {
		switch u := u.(type) {
		case *wire.JobUpdateBuilding:
			order = append(order, "building "+u.BuildID)
		case *wire.JobUpdateBuildOutput:
			order = append(order, "output "+u.BuildID)
		}
	}
	if want := []string{"building b1", "output b1", "building b2", "output b2"}; !reflect.DeepEqual(order, want) {
		t.Errorf("update order = %v, want %v", order, want)
	}
}

// Cancelling the context while Nix builds ends Run promptly with the
// context's error, not a JobError.
func TestUnitBuildCancelled(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	started := make(chan struct{})
	h.store.build = func(ctx context.Context, drv string, opts nix.BuildOptions) (map[string]string, error) {
		close(started)
		<-ctx.Done()
		return nil, &nix.PermanentError{Message: "interrupted"} // what a killed build looks like
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.run(ctx, buildJob(spec("b1", g.target))) }()
	<-started
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
		var je *worker.JobError
		if errors.As(err, &je) {
			t.Errorf("Run = JobError %v, want the bare context error", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if n := len(h.rec.of("upload")); n != 0 {
		t.Errorf("%d uploads after cancel", n)
	}
}

// A context cancelled before the job starts: no Building, the context error.
func TestUnitBuildCancelledBeforeStart(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := h.run(ctx, buildJob(spec("b1", g.target)))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	if n := len(h.rec.of("build")); n != 0 {
		t.Errorf("built with a cancelled context")
	}
}

// Unsupported build kinds fail Permanent after Building.
// A Substitute spec fetches the outputs the cache lacks from the local
// Nix's substituters (never building, fetching no inputs) and uploads
// them; one no substituter has is SubstituteUnavailable.
func TestUnitBuildSubstitute(t *testing.T) {
	out, lib := "/nix/store/"+strings.Repeat("s", 32)+"-tool", "/nix/store/"+strings.Repeat("t", 32)+"-tool-lib"
	sub := wire.BuildSpec{BuildID: "b1", DrvPath: "/nix/store/" + strings.Repeat("d", 32) + "-tool.drv", Kind: wire.BuildSpecSubstitute,
		Outputs: []wire.DerivationOutput{{Name: "out", Path: out}, {Name: "lib", Path: lib}}}

	h := newHarness(t)
	h.store.substitutable = map[string]bool{out: true, lib: true}
	if err := h.run(context.Background(), buildJob(sub)); err != nil {
		t.Fatal(err)
	}
	if len(h.rec.of("build")) != 0 || len(h.rec.of("import")) != 0 {
		t.Errorf("a substitute job built or pulled: %v", h.rec.all())
	}
	if got := h.rec.uploadedPaths(); !slices.Contains(got, out) || !slices.Contains(got, lib) {
		t.Errorf("uploaded %v, want both outputs", got)
	}
	var report *wire.JobUpdateBuildOutput
	for _, u := range h.rec.updates() {
		if o, ok := u.(*wire.JobUpdateBuildOutput); ok {
			report = o
		}
	}
	if report == nil || !report.Substituted || len(report.Outputs) != 2 {
		t.Errorf("BuildOutput %+v, want both outputs, substituted", report)
	}

	h = newHarness(t)
	h.store.substitutable = map[string]bool{out: true}
	err := h.run(context.Background(), buildJob(sub))
	je := jobError(t, err, wire.FailureSubstituteUnavailable)
	if !slices.Contains(je.MissingPaths, lib) {
		t.Errorf("missing %v, want %s", je.MissingPaths, lib)
	}
	if b, ok := h.rec.updates()[0].(*wire.JobUpdateBuilding); !ok || b.BuildID != "b1" {
		t.Errorf("first update %#v, want Building", h.rec.updates()[0])
	}
}

// A Download spec (builtin:fetchurl) is realised by Nix like a build: Nix
// fetches and verifies the fixed output; it is then uploaded.
func TestUnitBuildDownloadIsRealised(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	s := spec("b1", g.target)
	s.Kind = wire.BuildSpecDownload
	if err := h.run(context.Background(), buildJob(s)); err != nil {
		t.Fatal(err)
	}
	if builds := h.rec.of("build"); len(builds) != 1 || builds[0].paths[0] != g.target {
		t.Errorf("builds %v, want the download's .drv realised", builds)
	}
}

// A build that logs more than its burst allowance sends what fits, one
// line saying the rest was dropped, and nothing after; it still succeeds.
func TestUnitBuildLogRateLimit(t *testing.T) {
	h := newHarness(t)
	h.exec.LogBurstPerMinute = 100
	g := h.setupBuild()
	h.store.build = func(ctx context.Context, drv string, opts nix.BuildOptions) (map[string]string, error) {
		for i := range 50 {
			fmt.Fprintf(opts.LogWriter, "noisy line %02d\n", i) // 14 bytes each: 7 fit
		}
		h.store.mu.Lock()
		outs := h.store.drvs[drv].OutputPaths()
		h.store.mu.Unlock()
		for _, p := range outs {
			h.store.setValid(p)
		}
		return outs, nil
	}
	if err := h.run(context.Background(), buildJob(spec("b1", g.target))); err != nil {
		t.Fatalf("a rate-limited log failed the build: %v", err)
	}
	var sent []byte
	for _, e := range h.rec.of("log") {
		sent = append(sent, e.data...)
	}
	want := "noisy line 00\nnoisy line 01\nnoisy line 02\nnoisy line 03\nnoisy line 04\nnoisy line 05\nnoisy line 06\n" + truncatedLine
	if string(sent) != want {
		t.Fatalf("log sent:\n%s\nwant:\n%s", sent, want)
	}
}

// While a build runs, its .drv is pinned by a GC root link (and the
// outputs are, until uploaded); when the job ends its links are gone.
func TestUnitBuildPinsWithGCRoots(t *testing.T) {
	h := newHarness(t)
	h.exec.GCRootsDir = filepath.Join(t.TempDir(), "gcroots")
	g := h.setupBuild()
	var during []string
	h.store.build = func(ctx context.Context, drv string, opts nix.BuildOptions) (map[string]string, error) {
		entries, _ := os.ReadDir(h.exec.GCRootsDir)
		for _, e := range entries {
			target, _ := os.Readlink(filepath.Join(h.exec.GCRootsDir, e.Name()))
			during = append(during, target)
		}
		h.store.mu.Lock()
		outs := h.store.drvs[drv].OutputPaths()
		h.store.mu.Unlock()
		for _, p := range outs {
			h.store.setValid(p)
		}
		return outs, nil
	}
	if err := h.run(context.Background(), buildJob(spec("b1", g.target))); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(during, g.target) {
		t.Errorf("roots during the build %v, want the .drv %s", during, g.target)
	}
	if entries, _ := os.ReadDir(h.exec.GCRootsDir); len(entries) != 0 {
		t.Errorf("%d root links left after the job", len(entries))
	}
}

// A BuildSpec limit of 0 runs Nix without that limit, and so does one too
// large for a Duration (it must not wrap round into a short limit).
func TestUnitBuildZeroAndHugeLimitsAreNone(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	zero, huge := uint64(0), uint64(1)<<62+12345 // × 1e9 ns wraps round to 12345 s
	s := spec("b1", g.target)
	s.TimeoutSecs, s.MaxSilentSecs = &zero, &huge
	if err := h.run(context.Background(), buildJob(s)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	bs := h.rec.of("build")
	if len(bs) != 1 || bs[0].opts.Timeout != 0 || bs[0].opts.MaxSilent != 0 {
		t.Fatalf("builds %+v, want one without a timeout or a max-silent limit", bs)
	}
}

// A build that starts while the worker evaluates a flake runs with
// EvalBuildNice (lower CPU priority); one after the evaluation, without.
func TestUnitBuildNiceWhileEvaluating(t *testing.T) {
	h := newHarness(t)
	h.exec.EvalBuildNice = 10
	g := h.setupBuild()
	source := sp("flake-source")
	h.store.setValid(source)
	h.store.eval = &nix.Evaluation{}
	h.store.evalStarted, h.store.evalGate = make(chan struct{}), make(chan struct{})
	evaluated := make(chan error, 1)
	go func() { evaluated <- h.run(t.Context(), evalJob(source)) }()
	<-h.store.evalStarted
	if err := h.run(t.Context(), buildJob(spec("during", g.target))); err != nil {
		t.Fatalf("build during the evaluation: %v", err)
	}
	close(h.store.evalGate)
	if err := <-evaluated; err != nil {
		t.Fatalf("evaluation: %v", err)
	}
	h.store.mu.Lock() // the outputs gone again: the second job builds too
	delete(h.store.valid, g.out)
	delete(h.store.valid, g.outDoc)
	h.store.mu.Unlock()
	if err := h.run(t.Context(), buildJob(spec("after", g.target))); err != nil {
		t.Fatalf("build after the evaluation: %v", err)
	}
	builds := h.rec.of("build")
	if len(builds) != 2 {
		t.Fatalf("%d builds, want 2", len(builds))
	}
	if got := builds[0].opts.Nice; got != 10 {
		t.Errorf("build during the evaluation ran with nice %d, want 10", got)
	}
	if got := builds[1].opts.Nice; got != 0 {
		t.Errorf("build after the evaluation ran with nice %d, want 0", got)
	}
}
