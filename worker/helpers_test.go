package worker

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }

// blockingExecutor runs every job until its context ends and reports why.
type blockingExecutor struct {
	started chan Assignment
	ended   chan error // the context's cause
}

func newBlockingExecutor() *blockingExecutor {
	return &blockingExecutor{started: make(chan Assignment, 16), ended: make(chan error, 16)}
}

func (e *blockingExecutor) Run(ctx context.Context, job Assignment, report Reporter) error {
	if err := report.Update(&wire.JobUpdateBuilding{BuildID: "b1"}); err != nil {
		return err
	}
	e.started <- job
	<-ctx.Done()
	e.ended <- context.Cause(ctx)
	return Fail(wire.FailureTransient, ctx.Err())
}

func recvChan[T any](t *testing.T, what string, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// testConfig is a worker with every capability, fast backoff and a
// heartbeat too slow to interleave with what a test waits for.
func testConfig(t *testing.T, url string, exec Executor) Config {
	log, _ := testlog.New(t, "worker")
	return Config{
		Session: workersession.Config{
			ServerURL:      url,
			WorkerID:       storage.NewID(),
			Capabilities:   wire.GradientCapabilities{Fetch: true, Eval: true, Build: true},
			Heartbeat:      time.Hour,
			BackoffInitial: 20 * time.Millisecond,
			BackoffMax:     200 * time.Millisecond,
			Logger:         log,
		},
		Executor:     exec,
		CPUCoreScore: 1,
	}
}

// startWorker runs a worker; the returned stop cancels it (as SIGTERM
// does) and waits for Run to return.
func startWorker(t *testing.T, cfg Config) (w *Worker, stop func()) {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := recvChan(t, "Run to return", done); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return w, stop
}

// fakeServer is a small observing authority on loopback: it accepts every
// worker, records what it receives, and lets a test send anything.
type fakeServer struct {
	t     *testing.T
	url   string
	conns chan *fakeConn
}

type fakeConn struct {
	sess *session.ServerSession
	msgs chan wire.ClientMessage
	done chan struct{}
}

type openAuthority struct{}

func (openAuthority) Challenge(context.Context, string) ([]string, error) {
	return []string{"peer"}, nil
}

func (openAuthority) Authorize(context.Context, string, []wire.Pair[string, string]) (handshake.Decision, error) {
	return handshake.Accept([]string{"peer"}, nil, handshake.AllCapabilities), nil
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{t: t, conns: make(chan *fakeConn, 8)}
	discard := slog.New(slog.DiscardHandler)
	hs := httptest.NewServer(session.Handler(func(r *http.Request, tr session.Transport) {
		c := session.NewConn(tr, session.ConnOptions{Logger: discard})
		est, err := session.RunAuthority(r.Context(), c, session.AuthorityConfig{Policy: openAuthority{}})
		if err != nil {
			return
		}
		fc := &fakeConn{sess: session.SplitServer(c, est, session.Options{Logger: discard}),
			msgs: make(chan wire.ClientMessage, 256), done: make(chan struct{})}
		f.conns <- fc
		defer close(fc.done)
		for {
			m, err := fc.sess.Recv(r.Context())
			if err != nil {
				return
			}
			fc.msgs <- m
		}
	}))
	t.Cleanup(hs.Close)
	f.url = "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
	return f
}

func (f *fakeServer) accept() *fakeConn {
	f.t.Helper()
	return recvChan(f.t, "a worker session", f.conns)
}

func (c *fakeConn) next(t *testing.T) wire.ClientMessage {
	t.Helper()
	return recvChan(t, "a worker message", c.msgs)
}

// expect skips heartbeat messages until one of type T arrives.
func expect[T wire.ClientMessage](t *testing.T, c *fakeConn) T {
	t.Helper()
	for {
		m := c.next(t)
		if v, ok := m.(T); ok {
			return v
		}
		switch m.(type) {
		case *wire.WorkerMetrics, *wire.RequestJob, *wire.WorkerCapabilities, *wire.RequestJobList, *wire.JobUpdate, *wire.AssignJobResponse:
			continue
		}
		var zero T
		t.Fatalf("got %s (%+v), want %T", m.WireName(), m, zero)
	}
}

func (c *fakeConn) send(t *testing.T, m wire.ServerMessage) {
	t.Helper()
	if err := c.sess.Send(m); err != nil {
		t.Fatal(err)
	}
}

func buildJob(id, assignment string) *wire.AssignJob {
	return &wire.AssignJob{JobID: id, AssignmentID: assignment, Job: &wire.BuildJob{}}
}

// realServer is the server package on loopback over a real database, with
// one team, a project subscribed to a cache, and a second such project.
type realServer struct {
	t       testing.TB
	db      *storage.DB
	cfg     server.Config
	srv     *server.Server
	hs      *httptest.Server
	addr    string
	url     string
	logs    *testlog.Buffer
	project storage.Project
	second  storage.Project
	cache   storage.Cache // both projects'
}

func newRealServer(t testing.TB, db *storage.DB, cfg server.Config) *realServer {
	t.Helper()
	ctx := t.Context()
	r := &realServer{t: t, db: db, cfg: cfg}
	r.start("127.0.0.1:0")
	team, err := db.CreateTeam(ctx, "ops")
	if err != nil {
		t.Fatal(err)
	}
	cache, err := db.CreateCache(ctx, storage.NewCache{Name: "main"})
	if err != nil {
		t.Fatal(err)
	}
	r.cache = cache
	for i, p := range []*storage.Project{&r.project, &r.second} {
		name := []string{"web", "api"}[i]
		if *p, err = db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: name, Repository: "https://example.invalid/" + name + ".git", Branch: "main"}); err != nil {
			t.Fatal(err)
		}
		if _, err = db.SubscribeProject(ctx, p.ID, cache.ID); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// start serves on addr (the same address again after stop: a restart).
func (r *realServer) start(addr string) {
	r.t.Helper()
	var log *slog.Logger
	log, r.logs = testlog.New(r.t, "server")
	cfg := r.cfg
	cfg.Logger = log
	r.srv = server.New(r.db, cfg)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.hs = httptest.NewUnstartedServer(r.srv.Handler())
	r.hs.Listener.Close()
	r.hs.Listener = ln
	r.hs.Start()
	r.addr = ln.Addr().String()
	r.url = "ws://" + r.addr + "/proto"
	srv, hs := r.srv, r.hs
	r.t.Cleanup(func() { srv.Close(); hs.Close() })
}

func (r *realServer) stop() {
	r.srv.Close()
	r.hs.CloseClientConnections()
	r.hs.Close()
}

func (r *realServer) register(projectID, workerID string) string {
	r.t.Helper()
	return r.registerAs(storage.Peer{Kind: storage.PeerProject, ID: projectID}, workerID)
}

func (r *realServer) registerAs(peer storage.Peer, workerID string) string {
	r.t.Helper()
	_, token, err := r.db.CreateRegistration(r.t.Context(), peer, workerID, storage.DefaultWorkerSettings())
	if err != nil {
		r.t.Fatal(err)
	}
	return token
}

func flakeJob(id, assignment string) *wire.AssignJob {
	return &wire.AssignJob{JobID: id, AssignmentID: assignment, Job: &wire.FlakeJob{
		Steps: []wire.FlakeStep{wire.FlakeStepFetchFlake}, Source: &wire.FlakeSourceRepository{URL: "https://example.invalid/x.git", Commit: "0123"},
	}}
}

// openSQLite is a fresh SQLite database, for tests that need one engine.
func openSQLite(t testing.TB) *storage.DB {
	t.Helper()
	db, err := storage.Open(t.Context(), storagetest.SQLiteURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func pairs(peer, token string) []wire.Pair[string, string] {
	return []wire.Pair[string, string]{{First: peer, Second: token}}
}
