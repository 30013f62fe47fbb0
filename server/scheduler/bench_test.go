package scheduler_test

// Dispatch and restart-storm benchmarks (docs/PERFORMANCE.md, "Job
// dispatch"). They run only with -bench; BenchmarkRestartStorm also needs
// GRADIENT_BENCH_STORM=1 (it registers 1,000 workers, one argon2id hash
// each, before it starts).

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/internal/gctune"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

var benchEngines = []struct {
	name string
	url  func(testing.TB) string
}{
	{"postgres", benchPostgresURL},
	{"sqlite", benchSQLiteURL},
}

const benchCommit = "0123456789abcdef0123456789abcdef01234567"

// dispatchRig is a server with build workers and one evaluating worker
// whose flake job discovers the benchmark's derivations.
type dispatchRig struct {
	db      *storage.DB
	project storage.Project
	srv     *benchServer
	// others are further server instances on the same database (their
	// own pools), each serving its share of the build workers.
	others []*benchServer
	// gate is closed by the benchmark to let the flake job complete;
	// evaluated is closed once its EvalResult batches are sent.
	gate, evaluated chan struct{}
	batches         []*wire.JobUpdateEvalResult
}

// newDispatchRig starts a server, `workers` build workers with hooks and
// the evaluating worker, and waits until all of them poll.
func newDispatchRig(b *testing.B, dbURL string, workers int, hooks *workerHooks) *dispatchRig {
	return newDispatchRigOn(b, dbURL, workers, 1, hooks)
}

// newDispatchRigOn is newDispatchRig with `instances` server instances
// sharing the database (PostgreSQL), the build workers split evenly
// between them, the evaluating worker on the first. Several instances
// have instance IDs, so their job loops tell each other about work.
func newDispatchRigOn(b *testing.B, dbURL string, workers, instances int, hooks *workerHooks) *dispatchRig {
	b.Helper()
	db, project := benchDB(b, dbURL)
	ids := registerWorkers(b, db, project.ID, workers+1)
	r := &dispatchRig{db: db, project: project, gate: make(chan struct{}), evaluated: make(chan struct{})}
	instanceID := func(i int) string {
		if instances == 1 {
			return ""
		}
		return fmt.Sprintf("bench-%c", 'a'+i)
	}
	r.srv = startBenchInstance(b, db, "127.0.0.1:0", 0, instanceID(0))
	b.Cleanup(r.srv.stop) // after the workers' cleanups (last in, first out)
	servers := []*benchServer{r.srv}
	for i := 1; i < instances; i++ {
		odb := testworld.Open(b, dbURL) // its own pool, as another process has
		srv := startBenchInstance(b, odb, "127.0.0.1:0", 0, instanceID(i))
		b.Cleanup(srv.stop)
		r.others = append(r.others, srv)
		servers = append(servers, srv)
	}
	evalHooks := &workerHooks{
		evaluate: func(*wire.AssignJob) []*wire.JobUpdateEvalResult { return r.batches },
		flakeCompleting: func() {
			close(r.evaluated)
			<-r.gate
			if hooks.flakeCompleting != nil {
				hooks.flakeCompleting()
			}
		},
	}
	newEvalWorker(ids[0], r.srv.url, evalHooks).start(b, project.ID)
	want := make([]int, len(servers))
	want[0] = 1
	var connected atomic.Int64
	if hooks.held != nil {
		hooks.connected = func() { connected.Add(1) }
	}
	for i, id := range ids[1:] {
		newBuildWorker(id, servers[i%len(servers)].url, hooks).start(b, project.ID)
		want[i%len(servers)]++
	}
	if hooks.held != nil {
		// Build workers poll only once held is closed.
		want = make([]int, len(servers))
		want[0] = 1
		waitfor.Within(b, time.Minute, "the build workers connected", func() bool { return connected.Load() >= int64(workers) })
	}
	for i, srv := range servers {
		if !srv.loop.waitPolling(want[i], time.Minute) {
			b.Fatalf("instance %d: %d of %d workers polling after a minute", i, srv.loop.pollingWorkers(), want[i])
		}
	}
	return r
}

// evaluate starts an evaluation discovering n derivations and returns once
// the server stored them all; the flake job then waits for r.gate.
func (r *dispatchRig) evaluate(b *testing.B, n int, chain bool) storage.Evaluation {
	b.Helper()
	r.batches = derivations(evalTag(), n, chain)
	ev, err := r.srv.sched.StartEvaluation(context.Background(), storage.NewEvaluation{ProjectID: r.project.ID,
		RepositoryURL: r.project.Repository, Commit: benchCommit, Wildcards: []string{"packages.x86_64-linux.*"}})
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-r.evaluated:
	case <-time.After(time.Minute):
		b.Fatal("the flake job was not assigned within a minute")
	}
	// The EvalResult batches are handled in order before anything else of
	// the session: wait until they are stored.
	wait := 2*time.Minute + time.Duration(n/1000)*10*time.Second
	deadline := time.Now().Add(wait)
	for {
		builds, err := jobqueue.New(r.db).EvaluationBuilds(context.Background(), ev.ID)
		if err != nil {
			b.Fatal(err)
		}
		if len(builds) == n {
			return ev
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d derivations stored after %v", len(builds), n, wait)
		}
		time.Sleep(10*time.Millisecond + time.Duration(n/100)*time.Millisecond)
	}
}

// BenchmarkDispatchThroughput: 50 connected workers that finish jobs at
// once; one evaluation makes b.N independent builds runnable together.
// assignments/s is b.N over the time from the flake's JobCompleted to the
// last AssignJob received by a worker (every build but the last 50 is
// also completed and recorded by then). Allocations are the whole
// process: server, scheduler, database driver and the 51 workers.
//
//	go test -run '^$' -bench DispatchThroughput -benchtime 4000x -count 3 ./server/scheduler
func BenchmarkDispatchThroughput(b *testing.B) {
	for _, e := range benchEngines {
		b.Run(e.name, func(b *testing.B) {
			b.ReportAllocs()
			runThroughput(b, e.url(b), b.N, false)
		})
	}
}

// BenchmarkDispatchScale is BenchmarkDispatchThroughput at fixed queue
// sizes, one evaluation per run whatever b.N: the first assignment, the
// sustained rate and the process's memory (heap and RSS; the 51 workers
// share the process) at 4,000 builds, and with GRADIENT_BENCH_SCALE=1
// also at 20,000, 50,000 and 100,000 (minutes of setup each: the CI's
// -benchtime 1x runs only the first). GRADIENT_BENCH_SCALE may also
// list the sizes: GRADIENT_BENCH_SCALE=4000,100000.
//
//	GRADIENT_BENCH_SCALE=1 go test -run '^$' -bench DispatchScale -benchtime 1x -timeout 60m ./server/scheduler
func BenchmarkDispatchScale(b *testing.B) {
	for _, e := range benchEngines {
		for _, n := range scaleSizes(b) {
			b.Run(fmt.Sprintf("%s/builds=%d", e.name, n), func(b *testing.B) {
				onePerRun(b)
				runThroughput(b, e.url(b), n, true)
			})
		}
	}
}

// BenchmarkDispatchInstances is BenchmarkDispatchScale on PostgreSQL with
// one server instance against two sharing the database (README "Several
// instances"), side by side in one run: the 50 build workers split
// between the two, the evaluation and its readied builds on the first,
// which tells the second about them (notes, server/scheduler/notify.go).
// The build workers ask for work once the whole evaluation is queued on
// both, so first-assignment-ms is the first pick from the full queue.
// The sizes are BenchmarkDispatchScale's (GRADIENT_BENCH_SCALE).
//
//	GRADIENT_BENCH_SCALE=4000,100000 go test -run '^$' -bench DispatchInstances -benchtime 1x -timeout 60m ./server/scheduler
func BenchmarkDispatchInstances(b *testing.B) {
	for _, n := range scaleSizes(b) {
		for _, instances := range []int{1, 2} {
			b.Run(fmt.Sprintf("builds=%d/instances=%d", n, instances), func(b *testing.B) {
				onePerRun(b)
				runThroughputOn(b, benchPostgresURL(b), n, instances, false, true)
			})
		}
	}
}

// BenchmarkQueueMemory: the server's memory with a whole evaluation
// queued and no build worker to take any of it: the heap after a
// collection, less the heap before the evaluation completed
// (queued-heap-MiB, and per build), and the process's RSS then. The sizes
// are BenchmarkDispatchScale's (GRADIENT_BENCH_SCALE).
//
//	GRADIENT_BENCH_SCALE=100000 go test -run '^$' -bench QueueMemory -benchtime 1x ./server/scheduler
func BenchmarkQueueMemory(b *testing.B) {
	for _, e := range benchEngines {
		for _, n := range scaleSizes(b) {
			b.Run(fmt.Sprintf("%s/builds=%d", e.name, n), func(b *testing.B) {
				onePerRun(b)
				{
					r := newDispatchRig(b, e.url(b), 0, &workerHooks{})
					r.evaluate(b, n, false)
					r.batches = nil
					var before, after runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&before)
					close(r.gate)
					waitfor.Within(b, 10*time.Minute, "the whole evaluation queued", func() bool { return r.srv.sched.QueueLen() == n })
					runtime.GC()
					runtime.ReadMemStats(&after)
					queued := float64(after.HeapInuse) - float64(before.HeapInuse)
					b.ReportMetric(queued/(1<<20), "queued-heap-MiB")
					b.ReportMetric(queued/float64(n), "heap-B/build")
					b.ReportMetric(float64(residentBytes())/(1<<20), "rss-MiB")
				}
			})
		}
	}
}

// onePerRun skips a scale benchmark asked for more than one run (such as
// -benchtime 4000x meant for DispatchThroughput): each run is one whole
// evaluation of the size in its name.
func onePerRun(b *testing.B) {
	if b.N > 1 {
		b.Skipf("one evaluation per run: use -benchtime 1x (b.N = %d)", b.N)
	}
}

// scaleSizes are the evaluation sizes of the scale benchmarks: 4,000,
// or those GRADIENT_BENCH_SCALE names (1: 4,000 to 100,000).
func scaleSizes(b *testing.B) []int {
	switch v := os.Getenv("GRADIENT_BENCH_SCALE"); v {
	case "", "0":
		return []int{4000}
	case "1":
		return []int{4000, 20_000, 50_000, 100_000}
	default:
		var sizes []int
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 100 {
				b.Fatalf("GRADIENT_BENCH_SCALE=%q: want 1 or sizes of at least 100", v)
			}
			sizes = append(sizes, n)
		}
		return sizes
	}
}

// runThroughput runs one evaluation of n independent builds through 50
// workers and reports its metrics; memory adds the heap and RSS.
func runThroughput(b *testing.B, dbURL string, n int, memory bool) {
	runThroughputOn(b, dbURL, n, 1, memory, false)
}

// runThroughputOn is runThroughput with the 50 workers split between
// `instances` server instances on the database. With hold, the build
// workers ask for their first job only once the whole evaluation is
// queued on every instance (the first has the builds from the
// evaluation, the others from its notes), and the clock starts then: the
// first assignment is then the first pick from n queued builds (without,
// the builds streamed while evaluating are assigned before the clock
// starts, and first-assignment-ms comes out negative).
func runThroughputOn(b *testing.B, dbURL string, n, instances int, memory, hold bool) {
	var assigned atomic.Int64
	at := make([]int64, n) // when each assignment arrived, UnixNano
	all := make(chan struct{})
	var held chan struct{}
	if hold {
		held = make(chan struct{})
	}
	hooks := &workerHooks{held: held, assigned: func(m *wire.AssignJob) {
		if _, ok := m.Job.(*wire.BuildJob); !ok {
			return
		}
		i := assigned.Add(1)
		if i <= int64(n) {
			at[i-1] = time.Now().UnixNano()
		}
		if i == int64(n) {
			close(all)
		}
	}}
	r := newDispatchRigOn(b, dbURL, 50, instances, hooks)
	ev := r.evaluate(b, n, false)
	if held != nil {
		for i, srv := range append([]*benchServer{r.srv}, r.others...) {
			waitfor.Within(b, 10*time.Minute, fmt.Sprintf("the evaluation queued on instance %d", i), func() bool { return srv.sched.QueueLen() == n })
		}
	}
	var before runtime.MemStats
	var peak *heapSampler
	if memory {
		r.batches = nil // the workers' copy, not the server's
		runtime.GC()
		runtime.ReadMemStats(&before)
		peak = sampleHeap()
	}
	pg := startBackendCPU(b, dbURL)
	var stats pgStats
	if pg.conn != nil && pgStatsWanted() {
		stats = readPGStats(b, pg.conn)
	}
	b.ResetTimer()
	start := time.Now()
	cpu := startCPU()
	if held != nil {
		close(held)
	}
	close(r.gate)
	select {
	case <-all:
	case <-time.After(20 * time.Minute):
		b.Fatalf("%d of %d builds assigned after twenty minutes", assigned.Load(), n)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cpu.report(b)
	b.ReportMetric(float64(n)/elapsed.Seconds(), "assignments/s")
	// Sustained: the middle 80 % of the assignments, without the start
	// (the evaluation's completion readying every build and offering
	// them to 50 sessions) and the drain.
	if n >= 100 {
		slices.Sort(at)
		lo, hi := n/10, n-n/10
		b.ReportMetric(float64(hi-lo)/time.Duration(at[hi-1]-at[lo]).Seconds(), "sustained-assignments/s")
		b.ReportMetric(ms(time.Duration(at[0]-start.UnixNano())), "first-assignment-ms")
	}
	if hold {
		lost := 0.0
		for _, srv := range append([]*benchServer{r.srv}, r.others...) {
			lost += srv.sched.ClaimsLost()
		}
		b.ReportMetric(lost/float64(n), "lost-claims/assignment")
		if used := pg.used(); used >= 0 {
			b.ReportMetric(used/float64(n)*1e6, "pg-cpu-us/assignment")
		}
	}
	if memory {
		b.ReportMetric((processCPU()-cpu.proc)/float64(n)*1e6, "proc-cpu-us/assignment")
		if used := pg.used(); used >= 0 {
			b.ReportMetric(used/float64(n)*1e6, "pg-cpu-us/assignment")
		}
		b.ReportMetric(float64(before.HeapInuse)/(1<<20), "heap-before-MiB")
		b.ReportMetric(float64(peak.stop())/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(peak.peakRSS.Load())/(1<<20), "peak-rss-MiB")
	}
	waitEvaluation(b, r.db, ev.ID, 5*time.Minute)
	if stats != nil {
		logPGStatsSince(b, pg.conn, stats, n)
	}
}

// BenchmarkDispatchLatency: two idle workers; an evaluation whose b.N
// derivations form a chain, so each completed build makes exactly one
// job runnable. The latency is from the worker sending the JobCompleted
// that readied a job (for the first, the flake's) to a worker receiving
// its AssignJob: the completion's transaction, the claim's and both
// network hops.
//
//	go test -run '^$' -bench DispatchLatency -benchtime 2000x -count 3 ./server/scheduler
func BenchmarkDispatchLatency(b *testing.B) {
	for _, e := range benchEngines {
		b.Run(e.name, func(b *testing.B) {
			n := b.N
			var sent atomic.Int64 // UnixNano of the last JobCompleted
			var mu sync.Mutex
			latencies := make([]time.Duration, 0, n)
			all := make(chan struct{})
			mark := func() { sent.Store(time.Now().UnixNano()) }
			hooks := &workerHooks{
				completing:      mark,
				flakeCompleting: mark,
				assigned: func(m *wire.AssignJob) {
					if _, ok := m.Job.(*wire.BuildJob); !ok {
						return
					}
					d := time.Duration(time.Now().UnixNano() - sent.Load())
					mu.Lock()
					latencies = append(latencies, d)
					if len(latencies) == n {
						close(all)
					}
					mu.Unlock()
				},
			}
			r := newDispatchRig(b, e.url(b), 2, hooks)
			ev := r.evaluate(b, n, true)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := startCPU()
			close(r.gate)
			select {
			case <-all:
			case <-time.After(10 * time.Minute):
				b.Fatal("the chain did not finish within ten minutes")
			}
			b.StopTimer()
			cpu.report(b)
			mu.Lock()
			slices.Sort(latencies)
			b.ReportMetric(ms(quantile(latencies, 0.50)), "p50-ms")
			b.ReportMetric(ms(quantile(latencies, 0.99)), "p99-ms")
			b.ReportMetric(ms(latencies[len(latencies)-1]), "max-ms")
			mu.Unlock()
			waitEvaluation(b, r.db, ev.ID, time.Minute)
		})
	}
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkRestartStorm: 1,000 protocol workers (GRADIENT_BENCH_STORM_WORKERS)
// connected and polling; the server and scheduler stop and a new pair
// starts on the same address and database. Each op is one restart;
// storm-s is the time from the stop until every worker has reconnected
// (its own backoff: 1 s, then doubling, jittered as the real worker), passed the
// handshake and had its RequestJob handled by the new scheduler;
// after-listen-s counts from the new server listening. PostgreSQL only.
//
// Opt-in: GRADIENT_BENCH_STORM=1. GRADIENT_BENCH_STORM_HASH=sha256 stores
// the tokens as hex SHA-256 (the legacy form secret.Verify still accepts)
// instead of argon2id, to separate the password hashing from the rest.
//
//	GRADIENT_BENCH_STORM=1 go test -run '^$' -bench RestartStorm -benchtime 1x -count 3 -timeout 30m ./server/scheduler
func BenchmarkRestartStorm(b *testing.B) {
	if os.Getenv("GRADIENT_BENCH_STORM") != "1" {
		b.Skip("set GRADIENT_BENCH_STORM=1 to run the restart storm (≈1 minute of setup)")
	}
	n := 1000
	if v := os.Getenv("GRADIENT_BENCH_STORM_WORKERS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("GRADIENT_BENCH_STORM_WORKERS=%q", v)
		}
	}
	raiseFileLimit(b, uint64(4*n+256)) // both ends of each socket, the database
	// The collector as cmd/gradient-server sets it (the workers share
	// this process, and its heap).
	defer gctune.Apply(os.Getenv)()
	dbURL := benchPostgresURL(b)
	db, project := benchDB(b, dbURL)
	ids := registerWorkers(b, db, project.ID, n)
	if os.Getenv("GRADIENT_BENCH_STORM_HASH") == "sha256" {
		legacyTokenHashes(b, dbURL, ids)
	}
	srv := startBenchServer(b, db, "127.0.0.1:0", 2*n)
	b.Cleanup(func() { srv.stop() })
	workers := make([]*protoWorker, n)
	errs := &failures{}
	// Connect in small groups: the first connection is setup, not the
	// storm being measured.
	for i, id := range ids {
		workers[i] = newBuildWorker(id, srv.url, &workerHooks{})
		workers[i].errs = errs
		workers[i].start(b, project.ID)
		if (i+1)%8 == 0 || i == n-1 {
			if !srv.loop.waitPolling(i+1, 2*time.Minute) {
				b.Fatalf("%d of %d workers polling during setup", srv.loop.pollingWorkers(), i+1)
			}
		}
	}
	peak := sampleHeap()
	var storms, afterListen []time.Duration
	dials := func() (sum int64) {
		for _, w := range workers {
			sum += w.dialed.Load()
		}
		return sum
	}
	b.ResetTimer()
	for range b.N {
		before := dials()
		peak.reset()
		start := time.Now()
		srv.stop()
		srv = startBenchServer(b, db, srv.addr, 2*n)
		listening := time.Now()
		if !srv.loop.waitPolling(n, 10*time.Minute) {
			b.Fatalf("%d of %d workers polling ten minutes after the restart", srv.loop.pollingWorkers(), n)
		}
		storms = append(storms, time.Since(start))
		afterListen = append(afterListen, time.Since(listening))
		b.ReportMetric(float64(dials()-before)/float64(n), "dials/worker")
	}
	b.StopTimer()
	if e := errs.String(); e != "" {
		b.Logf("failed connection attempts:\n%s", e)
	}
	b.ReportMetric(slices.Max(storms).Seconds(), "storm-s")
	b.ReportMetric(slices.Max(afterListen).Seconds(), "after-listen-s")
	b.ReportMetric(float64(peak.stop())/(1<<20), "peak-heap-MiB")
}

// raiseFileLimit raises the soft RLIMIT_NOFILE to at least want (within
// the hard limit).
func raiseFileLimit(b *testing.B, want uint64) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	if lim.Cur >= want {
		return
	}
	if lim.Max < want {
		b.Skipf("RLIMIT_NOFILE hard limit %d < %d", lim.Max, want)
	}
	lim.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
}

// legacyTokenHashes replaces the workers' argon2id token hashes by hex
// SHA-256 ones.
func legacyTokenHashes(b *testing.B, dbURL string, ids []identity) {
	conn, err := sql.Open("pgx", dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	for _, id := range ids {
		if _, err := conn.Exec(`UPDATE worker_registrations SET token_hash = encode(sha256(convert_to($1, 'UTF8')), 'hex') WHERE worker_id = $2`,
			id.token, id.id); err != nil {
			b.Fatal(err)
		}
	}
}

// heapSampler records the peak heap in use (sampled every 50 ms).
type heapSampler struct {
	peak    atomic.Uint64
	peakRSS atomic.Uint64 // resident set of the process, /proc/self/statm
	done    chan struct{}
	wg      sync.WaitGroup
}

func sampleHeap() *heapSampler {
	h := &heapSampler{done: make(chan struct{})}
	h.wg.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-h.done:
				return
			case <-t.C:
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > h.peak.Load() {
				h.peak.Store(ms.HeapInuse)
			}
			if rss := residentBytes(); rss > h.peakRSS.Load() {
				h.peakRSS.Store(rss)
			}
		}
	})
	return h
}

func (h *heapSampler) reset() { h.peak.Store(0); h.peakRSS.Store(0) }

// residentBytes is the process's resident set (0 where /proc is missing).
func residentBytes() uint64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

func (h *heapSampler) stop() uint64 {
	close(h.done)
	h.wg.Wait()
	return h.peak.Load()
}

// backendCPU measures the CPU time of the PostgreSQL backends serving
// the benchmark's database (from /proc, so the server must be local):
// what the database costs per assignment, apart from whatever else the
// machine runs. It reads nothing on SQLite.
type backendCPU struct {
	conn  *sql.DB
	start map[int]float64
}

func startBackendCPU(b *testing.B, dbURL string) *backendCPU {
	if !strings.HasPrefix(dbURL, "postgres") {
		return &backendCPU{}
	}
	conn, err := sql.Open("pgx", dbURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	m := &backendCPU{conn: conn}
	m.start = m.read()
	return m
}

func (m *backendCPU) read() map[int]float64 {
	rows, err := m.conn.Query(`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	out := map[int]float64{}
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) != nil {
			return nil
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // not local
		}
		// Fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th.
		_, rest, _ := strings.Cut(string(data), ") ")
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		out[pid] = (ut + st) / 100 // USER_HZ
	}
	return out
}

// used is the backends' CPU seconds since the start, -1 when unknown.
func (m *backendCPU) used() float64 {
	if m.conn == nil {
		return -1
	}
	now := m.read()
	if len(now) == 0 {
		return -1
	}
	var sum float64
	for pid, v := range now {
		sum += v - m.start[pid]
	}
	return sum
}
