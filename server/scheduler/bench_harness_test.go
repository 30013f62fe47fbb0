package scheduler_test

// The benchmark harness: a real server and scheduler on a loopback
// listener, and protocol-level workers built from the session layer (no
// Nix): they answer every AssignJob at once, so the benchmarks measure the
// server, the scheduler and the database.

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/metrics"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

var quiet = slog.New(slog.DiscardHandler)

// Fresh databases for the benchmarks: a PostgreSQL schema (skipped when
// the server is unreachable) or a SQLite file.
var (
	benchPostgresURL = storagetest.PostgresURLOrSkip
	benchSQLiteURL   = storagetest.SQLiteURL
)

// benchDB opens a migrated database and a project subscribed to a cache.
func benchDB(b testing.TB, dbURL string) (*storage.DB, storage.Project) {
	b.Helper()
	slog.SetDefault(quiet) // storage logs its migrations there
	db := testworld.Open(b, dbURL)
	project, _ := testworld.Project(b, db, "https://example.invalid/bench.git")
	return db, project
}

// identity is a registered worker: its ID and the project's token.
type identity struct{ id, token string }

// registerWorkers registers n workers for the project, hashing tokens on
// every core (each registration is one argon2id hash).
func registerWorkers(b testing.TB, db *storage.DB, projectID string, n int) []identity {
	b.Helper()
	out := make([]identity, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				id := storage.NewID()
				_, token, err := db.CreateRegistration(context.Background(), storage.Peer{Kind: storage.PeerProject, ID: projectID}, id, storage.DefaultWorkerSettings())
				if err != nil {
					errs <- err
					return
				}
				out[i] = identity{id, token}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	return out
}

// countingLoop is the scheduler behind the server, counting the workers
// whose RequestJob the scheduler has handled.
type countingLoop struct {
	*scheduler.Scheduler
	mu       sync.Mutex
	polling  map[string]bool
	changed  chan struct{} // signalled on every new polling worker
	requests atomic.Int64
}

func (c *countingLoop) HandleJobMessage(w *authority.LiveWorker, m wire.ClientMessage) {
	c.Scheduler.HandleJobMessage(w, m)
	if _, ok := m.(*wire.RequestJob); ok {
		c.requests.Add(1)
		c.mu.Lock()
		if !c.polling[w.WorkerID] {
			c.polling[w.WorkerID] = true
			select {
			case c.changed <- struct{}{}:
			default:
			}
		}
		c.mu.Unlock()
	}
}

// pollingWorkers is how many distinct workers sent a RequestJob.
func (c *countingLoop) pollingWorkers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.polling)
}

// waitPolling waits until n distinct workers polled, or timeout.
func (c *countingLoop) waitPolling(n int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for c.pollingWorkers() < n {
		select {
		case <-c.changed:
		case <-deadline.C:
			return c.pollingWorkers() >= n
		}
	}
	return true
}

// benchServer is a server with the durable scheduler on a TCP listener.
type benchServer struct {
	sched *scheduler.Scheduler
	loop  *countingLoop
	srv   *server.Server
	hs    *http.Server
	addr  string
	url   string
}

// startBenchServer starts a server and its scheduler on addr (a free port
// for "127.0.0.1:0"), as gradient-server does: Start (recovery, queue
// load) before the first session.
func startBenchServer(b testing.TB, db *storage.DB, addr string, maxConns int) *benchServer {
	return startBenchInstance(b, db, addr, maxConns, "")
}

// startBenchInstance is startBenchServer as the server instance
// instanceID of several sharing the database (README "Several
// instances"): its job loop tells the others about work.
func startBenchInstance(b testing.TB, db *storage.DB, addr string, maxConns int, instanceID string) *benchServer {
	b.Helper()
	if instanceID != "" {
		// Its live row, as a server process keeps (server/instance): an
		// instance without one is taken for dead and its jobs recovered.
		if _, err := db.RegisterInstance(context.Background(), storage.ServerInstance{ID: instanceID, Host: "bench"}, time.Hour, false); err != nil {
			b.Fatal(err)
		}
	}
	reg := metrics.NewRegistry()
	sched := scheduler.New(db, scheduler.Config{Metrics: reg, Logger: quiet, InstanceID: instanceID})
	if err := sched.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	loop := &countingLoop{Scheduler: sched, polling: map[string]bool{}, changed: make(chan struct{}, 1)}
	// Every benchmark worker dials from 127.0.0.1: one address may hold as
	// many handshakes as there are connections.
	srv := server.New(db, server.Config{Jobs: loop, Metrics: reg, Logger: quiet, MaxConnections: maxConns, HandshakesPerIP: maxConns, InstanceID: instanceID})
	var ln net.Listener
	var err error
	for range 50 { // the old listener's port may take a moment to free
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler(), ErrorLog: nil}
	go hs.Serve(ln)
	s := &benchServer{sched: sched, loop: loop, srv: srv, hs: hs, addr: ln.Addr().String()}
	s.url = "ws://" + s.addr + "/proto"
	return s
}

// stop stops accepting, ends every session (as a server stop does) and
// stops the scheduler.
func (s *benchServer) stop() {
	s.hs.Close()
	s.srv.Close()
	s.sched.Close()
}

// protoWorker is a protocol-level worker: it polls for one kind of job and
// finishes every assigned job at once. It reconnects like the real worker
// (1 s initial backoff, doubling to 60 s, each wait up to 20 % shorter at
// random; reset by a session).
type protoWorker struct {
	id     identity
	url    string
	kind   wire.JobKind
	caps   wire.GradientCapabilities
	hooks  *workerHooks
	seq    atomic.Int64 // build outputs
	dialed atomic.Int64 // dial attempts
	errs   *failures    // why dials and handshakes failed; may be nil
}

// failures counts failed connection attempts by error text.
type failures struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *failures) add(err error) {
	if f == nil {
		return
	}
	msg := err.Error()
	if len(msg) > 120 {
		msg = msg[:120]
	}
	f.mu.Lock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[msg]++
	f.mu.Unlock()
}

func (f *failures) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var sb strings.Builder
	for msg, n := range f.n {
		fmt.Fprintf(&sb, "%6d × %s\n", n, msg)
	}
	return sb.String()
}

// workerHooks observe and steer the harness workers.
type workerHooks struct {
	// assigned is called on each AssignJob as it is received.
	assigned func(m *wire.AssignJob)
	// completing is called just before a build's JobCompleted is sent.
	completing func()
	// evaluate answers a flake job: the EvalResult batches to send before
	// JobCompleted; it may block (e.g. until the benchmark's timer starts).
	evaluate func(m *wire.AssignJob) []*wire.JobUpdateEvalResult
	// flakeCompleting is called just before a flake's JobCompleted.
	flakeCompleting func()
	// held, when set, holds a session's first RequestJob until it is
	// closed (the session is up and sent its WorkerCapabilities);
	// connected is called once the session waits for it.
	held      <-chan struct{}
	connected func()
}

func newBuildWorker(id identity, url string, hooks *workerHooks) *protoWorker {
	return &protoWorker{id: id, url: url, kind: wire.JobKindBuild, caps: wire.GradientCapabilities{Build: true}, hooks: hooks}
}

func newEvalWorker(id identity, url string, hooks *workerHooks) *protoWorker {
	return &protoWorker{id: id, url: url, kind: wire.JobKindFlake, caps: wire.GradientCapabilities{Fetch: true, Eval: true}, hooks: hooks}
}

// start runs the worker until the benchmark ends.
func (p *protoWorker) start(b testing.TB, projectID string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(ctx, projectID)
	}()
	b.Cleanup(func() { cancel(); <-done })
}

func (p *protoWorker) run(ctx context.Context, projectID string) {
	const initial, maxDelay = time.Second, 60 * time.Second
	delay := initial
	for ctx.Err() == nil {
		if p.session(ctx, projectID) {
			delay = initial
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay - time.Duration(rand.Int64N(int64(delay)/5+1))):
		}
		delay = min(delay*2, maxDelay)
	}
}

// session runs one session; it reports whether the handshake succeeded.
func (p *protoWorker) session(ctx context.Context, projectID string) bool {
	p.dialed.Add(1)
	tr, err := session.Dial(ctx, p.url, session.DialOptions{Logger: quiet})
	if err != nil {
		p.errs.add(err)
		return false
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: p.id.id, Capabilities: p.caps,
		Tokens: map[string]string{projectID: p.id.token}})
	if err != nil {
		p.errs.add(err)
		tr.Close(session.CloseNormal, "")
		return false
	}
	sess := session.SplitWorker(c, est, session.Options{Logger: quiet})
	defer sess.Close(session.CloseNormal, "bench over")
	send := func(m wire.ClientMessage) bool { return sess.Send(m) == nil }
	if !send(&wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, SystemFeatures: []string{},
		MaxConcurrentBuilds: 1, CPUCount: 1, CPUCoreScore: 1}) {
		return true
	}
	if p.hooks.held != nil {
		if p.hooks.connected != nil {
			p.hooks.connected()
		}
		select {
		case <-p.hooks.held:
		case <-ctx.Done():
			return true
		}
	}
	if !send(&wire.RequestJob{Kind: p.kind}) {
		return true
	}
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			return true
		}
		a, ok := m.(*wire.AssignJob)
		if !ok {
			continue
		}
		if p.hooks.assigned != nil {
			p.hooks.assigned(a)
		}
		if !p.finish(a, send) {
			return true
		}
	}
}

// finish answers an AssignJob the way a worker that builds in no time
// would, and asks for the next job.
func (p *protoWorker) finish(a *wire.AssignJob, send func(wire.ClientMessage) bool) bool {
	if !send(&wire.AssignJobResponse{JobID: a.JobID, Accepted: true}) {
		return false
	}
	switch job := a.Job.(type) {
	case *wire.BuildJob:
		bid := job.Builds[0].BuildID
		n := p.seq.Add(1)
		narSize, narHash := int64(1024), "sha256:"+fakeHash(n)
		out := wire.BuildOutput{Name: "out", StorePath: storage.StoreDir + "/" + fakeHash(n) + "-out", NarSize: &narSize, NarHash: &narHash, Products: []wire.BuildProduct{}}
		if !send(&wire.JobUpdate{JobID: a.JobID, AssignmentID: a.AssignmentID, Update: &wire.JobUpdateBuilding{BuildID: bid}}) ||
			!send(&wire.JobUpdate{JobID: a.JobID, AssignmentID: a.AssignmentID, Update: &wire.JobUpdateBuildOutput{BuildID: bid, Outputs: []wire.BuildOutput{out}}}) {
			return false
		}
		if p.hooks.completing != nil {
			p.hooks.completing()
		}
	case *wire.FlakeJob:
		var batches []*wire.JobUpdateEvalResult
		if p.hooks.evaluate != nil {
			batches = p.hooks.evaluate(a)
		}
		for _, r := range batches {
			if !send(&wire.JobUpdate{JobID: a.JobID, AssignmentID: a.AssignmentID, Update: r}) {
				return false
			}
		}
		if p.hooks.flakeCompleting != nil {
			p.hooks.flakeCompleting()
		}
	}
	return send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID, Spans: []wire.JobPhaseSpan{}}) &&
		send(&wire.RequestJob{Kind: p.kind})
}

// fakeHash is a 32-character store path hash part made from n.
func fakeHash(n int64) string { return fmt.Sprintf("%032d", n) }

// derivations are n discovered derivations; chain makes each depend on
// the one before it, else they are independent. tag keeps paths of
// different evaluations apart.
func derivations(tag string, n int, chain bool) []*wire.JobUpdateEvalResult {
	var out []*wire.JobUpdateEvalResult
	var cur *wire.JobUpdateEvalResult
	prev := ""
	for i := range n {
		if i%1000 == 0 { // ~250 KB per message, far below the 2 MiB cap
			cur = &wire.JobUpdateEvalResult{Warnings: []string{}, Errors: []string{}}
			out = append(out, cur)
		}
		hash := fmt.Sprintf("%s%0*d", tag, 32-len(tag), i)
		drv := storage.StoreDir + "/" + hash + "-bench-" + fmt.Sprint(i) + ".drv"
		deps := []string{}
		if chain && prev != "" {
			deps = []string{prev}
		}
		cur.Derivations = append(cur.Derivations, wire.DiscoveredDerivation{
			Attr: fmt.Sprintf("packages.x86_64-linux.bench%d", i), DrvPath: drv,
			Outputs:      []wire.DerivationOutput{{Name: "out", Path: storage.StoreDir + "/" + hash + "-bench-" + fmt.Sprint(i)}},
			Dependencies: deps, InputSources: []string{}, Architecture: "x86_64-linux", RequiredFeatures: []string{},
		})
		prev = drv
	}
	return out
}

var evalSeq atomic.Int64

// evalTag is a short tag unique per evaluation in a process (digits only,
// so the fake hashes stay in Nix's base-32 alphabet).
func evalTag() string { return fmt.Sprintf("%d9", evalSeq.Add(1)) }

// waitEvaluation polls until the evaluation ended and fails unless it
// succeeded.
func waitEvaluation(b testing.TB, db *storage.DB, id string, timeout time.Duration) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ev, err := jobqueue.New(db).Evaluation(context.Background(), id)
		if err != nil {
			b.Fatal(err)
		}
		if ev.Status.Terminal() {
			if ev.Status != storage.EvaluationSucceeded {
				b.Fatalf("evaluation %s: %s (%s)", id, ev.Status, ev.Error)
			}
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("evaluation %s still %s after %s", id, ev.Status, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cpuMeter measures, over an interval, the CPU this process used and the
// CPU the whole machine used (from /proc/stat, so it includes the local
// PostgreSQL server), both in cores.
type cpuMeter struct {
	start          time.Time
	proc, machine0 float64
}

func startCPU() cpuMeter {
	return cpuMeter{start: time.Now(), proc: processCPU(), machine0: machineBusy()}
}

// report adds proc-cores and machine-cores to b's metrics.
func (m cpuMeter) report(b *testing.B) {
	wall := time.Since(m.start).Seconds()
	b.ReportMetric((processCPU()-m.proc)/wall, "proc-cores")
	if busy := machineBusy(); busy >= 0 && m.machine0 >= 0 {
		b.ReportMetric((busy-m.machine0)/wall, "machine-cores")
	}
}

func processCPU() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// machineBusy is the busy CPU seconds of all cores since boot, -1 if
// unknown.
func machineBusy() float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 8 || fields[0] != "cpu" {
		return -1
	}
	var busy float64
	for i, f := range fields[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		busy += v
	}
	return busy / 100 // USER_HZ
}
