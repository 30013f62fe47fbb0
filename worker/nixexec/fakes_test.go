package nixexec

// In-memory fakes of Store, worker.Cache and worker.Reporter for the unit
// tests: no Nix, no server. Every call is appended, in order, to one shared
// event log so tests can check what happened before what.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

// sp makes a store path with a 32-character hash part derived from name.
func sp(name string) string {
	sum := sha256.Sum256([]byte(name))
	return storeDir + nixbase32.Encode(sum[:20]) + "-" + name
}

// base is a store path's base name (how cache entries may name references).
func base(p string) string { return filepath.Base(p) }

func nix32sha(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + nixbase32.Encode(sum[:])
}

// narOf is the fake NAR of a path.
func narOf(p string) []byte { return []byte("nar of " + p) }

// fileOf is the fake compressed object of a path in the cache.
func fileOf(p string) []byte { return []byte("zst of " + p) }

// event is one recorded call.
type event struct {
	kind   string // "update", "log", "send", "progress", "evalprogress", "query", "pull", "upload", "known", "fetch", "attrs", "derivations", "import", "build"
	update wire.JobUpdateKind
	msg    wire.ClientMessage
	task   uint32
	data   []byte
	mode   wire.QueryMode
	paths  []string
	imp    []nix.NarImport
	meta   worker.UploadMeta
	opts   nix.BuildOptions
}

type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) add(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) all() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *recorder) of(kind string) []event {
	var out []event
	for _, e := range r.all() {
		if e.kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// updates returns the JobUpdate kinds sent, in order.
func (r *recorder) updates() []wire.JobUpdateKind {
	var out []wire.JobUpdateKind
	for _, e := range r.of("update") {
		out = append(out, e.update)
	}
	return out
}

// uploadedPaths returns the uploaded store paths, in order.
func (r *recorder) uploadedPaths() []string {
	var out []string
	for _, e := range r.of("upload") {
		out = append(out, e.paths[0])
	}
	return out
}

// ---- Store ----

type fakeStore struct {
	rec *recorder

	mu      sync.Mutex
	valid   map[string]bool
	refs    map[string][]string // references of store paths (PathInfo)
	drvs    map[string]*nix.Derivation
	fetched *nix.FetchedFlake
	fetchEr error
	// lockedInputs are what LockedInputPaths lists, for any flake.
	lockedInputs []string
	eval         *nix.Evaluation
	evalErr      error
	// evalStarted, when set, is closed as Evaluate begins; evalGate,
	// when set, holds Evaluate until it is closed.
	evalStarted, evalGate chan struct{}
	// build runs Store.Build; nil returns the .drv's outputs (made valid).
	build func(ctx context.Context, drvPath string, opts nix.BuildOptions) (map[string]string, error)
	// importedFiles holds the compressed bytes each import read.
	importedFiles map[string][]byte
	// substitutable are the paths the configured substituters hold.
	substitutable map[string]bool
}

func newFakeStore(rec *recorder) *fakeStore {
	return &fakeStore{rec: rec, valid: map[string]bool{}, refs: map[string][]string{}, drvs: map[string]*nix.Derivation{}, importedFiles: map[string][]byte{}}
}

func (s *fakeStore) setValid(paths ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range paths {
		s.valid[p] = true
	}
}

func (s *fakeStore) isValid(p string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.valid[p]
}

// addDrv registers a parsed derivation (not made valid).
func (s *fakeStore) addDrv(d *nix.Derivation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drvs[d.Path] = d
}

func (s *fakeStore) FetchFlake(ctx context.Context, repoURL, commit string, opts nix.FetchOptions) (*nix.FetchedFlake, error) {
	s.rec.add(event{kind: "fetch", paths: []string{repoURL, commit}})
	if s.fetchEr != nil {
		return nil, s.fetchEr
	}
	s.setValid(s.fetched.SourcePath)
	s.setValid(s.fetched.InputPaths...)
	return s.fetched, nil
}

func (s *fakeStore) LockedInputPaths(ctx context.Context, flakeRef string) ([]string, error) {
	s.rec.add(event{kind: "inputs", paths: []string{flakeRef}})
	return s.lockedInputs, nil
}

func (s *fakeStore) Evaluate(ctx context.Context, flakeRef string, wildcards []string, opts nix.EvalOptions, found func(nix.FoundDerivation)) (*nix.Evaluation, error) {
	s.rec.add(event{kind: "attrs", paths: append([]string{flakeRef}, wildcards...)})
	if s.evalStarted != nil {
		close(s.evalStarted)
	}
	if s.evalGate != nil {
		select {
		case <-s.evalGate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if s.evalErr == nil && s.eval != nil {
		for _, d := range s.eval.Derivations {
			found(d)
		}
	}
	return s.eval, s.evalErr
}

func (s *fakeStore) Derivations(ctx context.Context, drvPaths ...string) (map[string]*nix.Derivation, error) {
	s.rec.add(event{kind: "derivations", paths: slices.Clone(drvPaths)})
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]*nix.Derivation{}
	for _, p := range drvPaths {
		d, ok := s.drvs[p]
		if !ok || !s.valid[p] {
			return nil, fmt.Errorf("fake store: %s is not valid", p)
		}
		out[p] = d
	}
	return out, nil
}

func (s *fakeStore) PathInfo(ctx context.Context, paths ...string) ([]nix.PathInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []nix.PathInfo
	for _, p := range paths {
		if !s.valid[p] {
			return nil, fmt.Errorf("fake store: path info of invalid %s", p)
		}
		nar := narOf(p)
		out = append(out, nix.PathInfo{Path: p, NarHash: nix32sha(nar), NarSize: int64(len(nar)), References: s.refs[p], Deriver: "", CA: ""})
	}
	return out, nil
}

func (s *fakeStore) ValidPaths(ctx context.Context, paths ...string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, p := range paths {
		if s.valid[p] {
			out = append(out, p)
		}
	}
	return out, nil
}

func (s *fakeStore) DumpPath(ctx context.Context, path string, w io.Writer) error {
	if !s.isValid(path) {
		return fmt.Errorf("fake store: dumping invalid %s", path)
	}
	_, err := w.Write(narOf(path))
	return err
}

// ImportNAR reads the object it is given to its end (the stream's own
// checks run at the end) and records it as one import.
func (s *fakeStore) ImportNAR(ctx context.Context, it nix.NarImport, zst io.Reader) error {
	b, err := io.ReadAll(zst)
	if err != nil {
		return fmt.Errorf("fake store: reading the NAR of %s: %w", it.StorePath, err)
	}
	s.mu.Lock()
	for _, ref := range it.References {
		if ref != it.StorePath && !s.valid[ref] {
			s.mu.Unlock()
			return fmt.Errorf("fake store: importing %s before its reference %s", it.StorePath, ref)
		}
	}
	s.importedFiles[it.StorePath] = b
	s.valid[it.StorePath] = true
	s.refs[it.StorePath] = it.References
	s.mu.Unlock()
	s.rec.add(event{kind: "import", imp: []nix.NarImport{it}})
	return nil
}

func (s *fakeStore) Build(ctx context.Context, drvPath string, opts nix.BuildOptions) (map[string]string, error) {
	s.rec.add(event{kind: "build", paths: []string{drvPath}, opts: opts})
	if s.build != nil {
		return s.build(ctx, drvPath, opts)
	}
	s.mu.Lock()
	d := s.drvs[drvPath]
	s.mu.Unlock()
	outs := d.OutputPaths()
	for _, p := range outs {
		s.setValid(p)
	}
	return outs, nil
}

func (s *fakeStore) AddIndirectRoot(ctx context.Context, link string) error { return nil }

func (s *fakeStore) Substitute(ctx context.Context, paths ...string) error {
	s.rec.add(event{kind: "substitute", paths: paths})
	for _, p := range paths {
		if !s.substitutable[p] {
			return fmt.Errorf("path '%s' is required, but there is no substituter that can build it", p)
		}
	}
	s.setValid(paths...)
	return nil
}

// ---- Cache ----

type fakeCache struct {
	rec *recorder

	mu sync.Mutex
	// entries is what the server's cache holds (Pull queries answer from
	// it; Push queries answer cached for these paths too).
	entries map[string]wire.CachedPath
	// content overrides the bytes OpenNar streams for a path (default fileOf).
	content map[string][]byte
	// pushErr fails Push queries.
	pushErr error
	// pullErr fails OpenNar calls.
	pullErr error
	// uploadErr fails the upload of a path.
	uploadErr map[string]error
	// known are the derivations KnownDerivations reports.
	known map[string]bool
	// knownErr fails KnownDerivations.
	knownErr error
	// uploads holds the bytes uploaded per path.
	uploads map[string][]byte
	// onUpload, when set, runs as each upload starts (it may block).
	onUpload func(path string)
}

func newFakeCache(rec *recorder) *fakeCache {
	return &fakeCache{rec: rec, entries: map[string]wire.CachedPath{}, content: map[string][]byte{}, uploadErr: map[string]error{}, known: map[string]bool{}, uploads: map[string][]byte{}}
}

// put makes the cache hold p with references refs (as given: full paths
// or base names).
func (c *fakeCache) put(p string, refs ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nar := narOf(p)
	file := fileOf(p)
	narHash := nix32sha(nar)
	fileHash := nix32sha(file)
	narSize := uint64(len(nar))
	fileSize := uint64(len(file))
	r := slices.Clone(refs)
	if r == nil {
		r = []string{}
	}
	deriver := base(sp("deriver-of-" + base(p) + ".drv"))
	ca := "fixed:r:sha256:" + base(p)
	c.entries[p] = wire.CachedPath{Path: p, Cached: true, NarHash: &narHash, FileHash: &fileHash, NarSize: &narSize, FileSize: &fileSize, References: &r, Deriver: &deriver, CA: &ca}
}

func (c *fakeCache) Query(ctx context.Context, jobID string, paths []string, mode wire.QueryMode) ([]wire.CachedPath, error) {
	c.rec.add(event{kind: "query", mode: mode, paths: slices.Clone(paths)})
	if mode == wire.QueryPush && c.pushErr != nil {
		return nil, c.pushErr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]wire.CachedPath, 0, len(paths))
	for _, p := range paths {
		if e, ok := c.entries[p]; ok {
			out = append(out, e)
		} else {
			out = append(out, wire.CachedPath{Path: p, Cached: false})
		}
	}
	return out, nil
}

func (c *fakeCache) OpenNar(ctx context.Context, jobID, path string) (io.ReadCloser, error) {
	c.rec.add(event{kind: "pull", paths: []string{path}})
	if c.pullErr != nil {
		return nil, c.pullErr
	}
	c.mu.Lock()
	b, ok := c.content[path]
	c.mu.Unlock()
	if !ok {
		b = fileOf(path)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (c *fakeCache) Upload(ctx context.Context, jobID, storePath string, nar io.Reader, meta worker.UploadMeta) error {
	if c.onUpload != nil {
		c.onUpload(storePath)
	}
	b, err := io.ReadAll(nar)
	if err != nil {
		return err
	}
	c.rec.add(event{kind: "upload", paths: []string{storePath}, data: b, meta: meta})
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.uploadErr[storePath]; err != nil {
		return err
	}
	c.uploads[storePath] = b
	return nil
}

func (c *fakeCache) KnownDerivations(ctx context.Context, jobID string, drvPaths []string) ([]string, error) {
	c.rec.add(event{kind: "known", paths: slices.Clone(drvPaths)})
	if c.knownErr != nil {
		return nil, c.knownErr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, p := range drvPaths {
		if c.known[p] {
			out = append(out, p)
		}
	}
	return out, nil
}

// ---- Reporter ----

type fakeReporter struct {
	rec   *recorder
	cache worker.Cache
}

func (r *fakeReporter) Update(u wire.JobUpdateKind) error {
	r.rec.add(event{kind: "update", update: u})
	return nil
}

func (r *fakeReporter) Log(taskIndex uint32, data []byte) error {
	r.rec.add(event{kind: "log", task: taskIndex, data: slices.Clone(data)})
	return nil
}

func (r *fakeReporter) BuildProgress(p wire.BuildProgress) error {
	r.rec.add(event{kind: "progress", msg: &p})
	return nil
}

func (r *fakeReporter) EvalProgress(p wire.EvalProgressState) error {
	r.rec.add(event{kind: "evalprogress"})
	return nil
}

func (r *fakeReporter) Send(m wire.ClientMessage) error {
	r.rec.add(event{kind: "send", msg: m})
	return nil
}

func (r *fakeReporter) Cache() worker.Cache { return r.cache }

// ---- harness ----

type harness struct {
	t     *testing.T
	rec   *recorder
	store *fakeStore
	cache *fakeCache
	rep   *fakeReporter
	exec  *Executor
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	rec := &recorder{}
	h := &harness{t: t, rec: rec, store: newFakeStore(rec), cache: newFakeCache(rec)}
	h.rep = &fakeReporter{rec: rec, cache: h.cache}
	h.exec = &Executor{Nix: h.store, Cores: 3, Logger: slog.New(slog.DiscardHandler)}
	return h
}

func (h *harness) run(ctx context.Context, job wire.Job) error {
	return h.exec.Run(ctx, worker.Assignment{JobID: "job-1", Job: job}, h.rep)
}

// index returns the position of the first event matching f, or -1.
func (h *harness) index(f func(event) bool) int {
	for i, e := range h.rec.all() {
		if f(e) {
			return i
		}
	}
	return -1
}

func isUploadOf(p string) func(event) bool {
	return func(e event) bool { return e.kind == "upload" && e.paths[0] == p }
}

// jobError asserts err is a *worker.JobError of kind and returns it.
func jobError(t *testing.T, err error, kind wire.BuildFailureKind) *worker.JobError {
	t.Helper()
	var je *worker.JobError
	if !errors.As(err, &je) {
		t.Fatalf("error = %v (%T), want a *worker.JobError of kind %v", err, err, kind)
	}
	if je.Kind != kind {
		t.Fatalf("JobError kind = %v, want %v (error: %v)", je.Kind, kind, err)
	}
	return je
}
