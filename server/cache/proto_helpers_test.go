package cache_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

// cacheProtoEnv is servertest.Env with a NAR store and, unless the test brings
// its own job loop, testJobs.
type cacheProtoEnv struct {
	*servertest.Env
	store *narstore.Local
	jobs  *testJobs
}

func newCacheProtoEnv(t testing.TB, db *storage.DB, cfg server.Config) *cacheProtoEnv {
	t.Helper()
	// A test that brings its own store (S3) gets a nil store field.
	var store *narstore.Local
	if cfg.NarStore == nil {
		var err error
		if store, err = narstore.OpenLocal(t.TempDir(), nil); err != nil {
			t.Fatal(err)
		}
		cfg.NarStore = store
	}
	jobs := &testJobs{jobs: map[string]testJob{}}
	if cfg.Jobs == nil {
		cfg.Jobs = jobs
	}
	return &cacheProtoEnv{Env: servertest.NewEnv(t, db, cfg), store: store, jobs: jobs}
}

// produce makes paths outputs of the build job "job" of the env's
// project, which every session holds: what uploadNar uploads.
func (e *cacheProtoEnv) produce(paths ...string) {
	e.jobs.mu.Lock()
	defer e.jobs.mu.Unlock()
	j := e.jobs.jobs["job"]
	j.products.Project, j.products.What = e.Project.ID, "build of a test derivation"
	j.products.Outputs = append(j.products.Outputs, paths...)
	e.jobs.jobs["job"] = j
}

// testJobs is a job loop that knows which worker holds each job (every
// worker if holder is "") and what the job produces.
type testJobs struct {
	mu   sync.Mutex
	jobs map[string]testJob
}

type testJob struct {
	holder   string // worker ID
	products authority.JobProducts
}

func (*testJobs) SessionStarted(*authority.LiveWorker)                       {}
func (*testJobs) HandleJobMessage(*authority.LiveWorker, wire.ClientMessage) {}
func (*testJobs) SessionEnded(*authority.LiveWorker, string)                 {}

func (j *testJobs) JobProducts(w *authority.LiveWorker, id string) (authority.JobProducts, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	job, ok := j.jobs[id]
	if !ok || (job.holder != "" && job.holder != w.WorkerID) {
		return authority.JobProducts{}, false
	}
	return job.products, true
}

func (j *testJobs) set(id, holder string, p authority.JobProducts) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.jobs[id] = testJob{holder: holder, products: p}
}

func (e *cacheProtoEnv) httpURL() string {
	return "http" + strings.TrimSuffix(strings.TrimPrefix(e.URL, "ws"), "/proto")
}

// projectWorker connects a worker registered for the env's project.
func (e *cacheProtoEnv) projectWorker() *servertest.Worker {
	id := storage.NewID()
	return e.MustConnect(id, map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)})
}

// cachePeerWorker connects a worker registered as a peer of cache.
func (e *cacheProtoEnv) cachePeerWorker(cache storage.Cache) *servertest.Worker {
	id := storage.NewID()
	return e.MustConnect(id, map[string]string{cache.ID: e.Register(storage.PeerCache, cache.ID, id)})
}

// testStorePath is a fresh store path named name, no Nix needed.
func testStorePath(name string) string {
	var b [20]byte
	rand.Read(b[:])
	return storage.StoreDir + "/" + nixbase32.Encode(b[:]) + "-" + name
}

func randomNar(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// putPath stores nar (uncompressed) as path in a cache, as the admin push
// API would.
func (e *cacheProtoEnv) putPath(t testing.TB, cacheID, path string, nar []byte, refs ...string) storage.CachePath {
	t.Helper()
	obj, err := e.store.Put(t.Context(), bytes.NewReader(nar), nil)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := e.DB.PutCachePath(t.Context(), storage.CachePath{
		CacheID: cacheID, StorePath: path, NarHash: obj.NarHashText(), NarSize: obj.NarSize,
		FileHash: obj.FileHashText(), FileSize: obj.FileSize, Compression: narstore.Compression,
		ObjectKey: obj.Key, References: refs,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recvAs returns the next message of type T, skipping others (logged).
func recvAs[T wire.ServerMessage](t testing.TB, sess *session.WorkerSession) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			var zero T
			t.Fatalf("recv, waiting for %T: %v", zero, err)
		}
		if v, ok := m.(T); ok {
			return v
		}
		t.Logf("skipping %s", m.WireName())
	}
}

func send(t testing.TB, sess *session.WorkerSession, m wire.ClientMessage) {
	t.Helper()
	if err := sess.Send(m); err != nil {
		t.Fatalf("send %s: %v", m.WireName(), err)
	}
}

// pullStream reads one path's NarStreamHeader and chunks until the final
// one, appending the data to have at each chunk's offset.
func pullStream(t testing.TB, sess *session.WorkerSession, have []byte) ([]byte, *wire.NarStreamHeader) {
	t.Helper()
	h := recvAs[*wire.NarStreamHeader](t, sess)
	for {
		p := recvAs[*wire.NarPush](t, sess)
		if p.StorePath != h.StorePath || p.Offset > uint64(len(have)) {
			t.Fatalf("chunk of %s at %d, have %d bytes of %s", p.StorePath, p.Offset, len(have), h.StorePath)
		}
		have = append(have[:p.Offset], p.Data...)
		if p.IsFinal {
			return have, h
		}
	}
}

// compressed is a worker's upload: the zstd bytes and their metadata.
type compressed struct {
	zst  []byte
	meta wire.NarUploadMetadata
}

func compressNar(t testing.TB, nar []byte, refs ...string) compressed {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	zst := enc.EncodeAll(nar, nil)
	fileSum, narSum := sha256.Sum256(zst), sha256.Sum256(nar)
	if refs == nil {
		refs = []string{}
	}
	return compressed{zst: zst, meta: wire.NarUploadMetadata{
		FileHash: "sha256:" + nixbase32.Encode(fileSum[:]), FileSize: uint64(len(zst)),
		NarHash: "sha256:" + nixbase32.Encode(narSum[:]), NarSize: uint64(len(nar)), References: refs,
	}}
}

// sendChunks relays zst as UploadChunk frames and the empty final one.
func sendChunks(t testing.TB, sess *session.WorkerSession, id uint64, zst []byte) {
	t.Helper()
	for off := 0; off < len(zst); off += session.BulkChunkSize {
		end := min(off+session.BulkChunkSize, len(zst))
		send(t, sess, &wire.UploadChunk{RequestID: id, Data: zst[off:end], Offset: uint64(off)})
	}
	send(t, sess, &wire.UploadChunk{RequestID: id, Offset: uint64(len(zst)), IsFinal: true})
}

// uploadNar runs a whole upload and returns the outcome (Skip is reported as
// a grant without chunks, then UploadOk).
func uploadNar(t testing.TB, sess *session.WorkerSession, id uint64, path string, c compressed) (wire.GrantTarget, wire.UploadOutcome) {
	t.Helper()
	send(t, sess, &wire.UploadRequest{JobID: "job", RequestID: id, Object: &wire.UploadNar{StorePath: path}, Size: c.meta.NarSize})
	grant, outcome := awaitGrant(t, sess, id)
	if outcome != nil {
		return nil, outcome
	}
	if _, skip := grant.(*wire.GrantSkip); skip {
		return grant, &wire.UploadOk{}
	}
	sendChunks(t, sess, id, c.zst)
	meta := c.meta
	send(t, sess, &wire.UploadFinished{RequestID: id, Metadata: &meta})
	return grant, recvAs[*wire.UploadCommitted](t, sess).Outcome
}

// awaitGrant waits for the grant of id, or an UploadCommitted before it.
func awaitGrant(t testing.TB, sess *session.WorkerSession, id uint64) (wire.GrantTarget, wire.UploadOutcome) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			t.Fatalf("waiting for the grant of %d: %v", id, err)
		}
		switch m := m.(type) {
		case *wire.UploadGrant:
			if m.RequestID == id {
				return m.Target, nil
			}
		case *wire.UploadCommitted:
			if m.RequestID == id {
				return nil, m.Outcome
			}
		}
	}
}

// buildDerivation records drv as built by an evaluation of projectID,
// through the job queue as the scheduler would.
// It returns the output path.
func buildDerivation(t *testing.T, db *storage.DB, projectID, drv string) string {
	t.Helper()
	queue := jobqueue.New(db)
	ctx := t.Context()
	ev, err := queue.CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: projectID, RepositoryURL: "https://example.invalid/x.git", Commit: "c0ffee"})
	if err != nil {
		t.Fatal(err)
	}
	claim := func() string {
		t.Helper()
		jobs, err := queue.PendingJobs(ctx)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("pending jobs %+v, %v", jobs, err)
		}
		id, err := queue.ClaimJob(ctx, jobs[0].JobID, storage.NewID())
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	flake := claim()
	out := testStorePath("x-out")
	if err := queue.AddDiscoveredDerivations(ctx, ev.ID, []storage.DiscoveredBuild{{Attr: "x", DrvPath: drv, Architecture: "x86_64-linux",
		Outputs: []storage.BuildOutputPath{{Name: "out", Path: out}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.CompleteFlakeJob(ctx, flake); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.CompleteBuild(ctx, claim(), []storage.BuildOutputInfo{{Name: "out", StorePath: out}}); err != nil {
		t.Fatal(err)
	}
	return out
}
