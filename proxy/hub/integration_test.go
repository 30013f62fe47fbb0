package hub_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/halfopen"
	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/proxy/downstream"
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/proxy/upstream"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/deploykeys"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) {
	// Databases log their migrations: keep warnings only.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(storagetest.Main(m))
}

// chainFlake: greeting ← shout ← report, a dependency chain, and a build
// that runs until it is stopped. Nothing but /bin/sh (offline).
const chainFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
  in {
    packages.${system} = rec {
      greeting = step "greeting" "echo building greeting; echo hello > $out";
      shout = step "shout" "read v < ${greeting}; echo \"$v!\" > $out";
      report = step "report" "read v < ${shout}; echo \"report: $v\" > $out";
    };
    checks.${system}.forever = step "forever" "while true; do echo still building; /bin/sleep 1; done";
  };
}
`

// proxyWorld is the proxy: its database and its two legs with their
// hubs. Tenants (each a real Gradient server with a scheduler and a
// cache) are added with addTenant; workers behind the proxy are real
// worker.Workers with the Nix executor.
type proxyWorld struct {
	t        *testing.T
	box      *sealbox.Box
	store    *proxystore.Store
	proxyURL string
	proxyLog *testlog.Buffer
	// dataDir holds the proxy's database, tempDir is its sessions'
	// temporary directory: neither may hold a NAR.
	dataDir, tempDir string
}

// fedWorld is one tenant: its server and its link at the proxy.
type fedWorld struct {
	*proxyWorld
	db      *storage.DB
	sched   *scheduler.Scheduler
	httpURL string
	project storage.Project
	cache   storage.Cache
	repo    string
	commit  string
	proxyID string // the proxy's worker ID at the tenant's server
	tenant  proxystore.Tenant
}

func newProxyWorld(t *testing.T, heartbeatTimeout time.Duration) *proxyWorld {
	t.Helper()
	p := &proxyWorld{t: t}
	var err error
	if p.box, err = sealbox.New(sealbox.NewKey()); err != nil {
		t.Fatal(err)
	}
	dbURL := storagetest.SQLiteURL(t)
	p.dataDir = filepath.Dir(strings.TrimPrefix(dbURL, "sqlite://"))
	if p.store, err = proxystore.Open(t.Context(), dbURL, p.box); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.store.Close() })
	p.tempDir = t.TempDir()
	p.proxyURL, p.proxyLog = runProxyIn(t, p.store, heartbeatTimeout, p.tempDir)
	return p
}

// newFedWorld is a proxy with one tenant whose flake is chainFlake.
func newFedWorld(t *testing.T, heartbeatTimeout time.Duration) *fedWorld {
	return newProxyWorld(t, heartbeatTimeout).addTenant("acme", chainFlake)
}

// addTenant runs the tenant's server with a project of flake that
// registered a worker ID for the proxy, and links the tenant to it.
func (p *proxyWorld) addTenant(name, flake string) *fedWorld {
	t := p.t
	t.Helper()
	ctx := t.Context()
	w := &fedWorld{proxyWorld: p, db: testworld.Open(t, storagetest.SQLiteURL(t))}
	quiet := slog.New(slog.DiscardHandler)
	w.sched = scheduler.New(w.db, scheduler.Config{Logger: quiet, Tick: 200 * time.Millisecond, DeployKeys: deploykeys.New(w.db, p.box),
		RetryBackoff: 200 * time.Millisecond})
	if err := w.sched.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.sched.Close)
	var serverURL string
	serverURL, w.httpURL = testworld.Serve(t, w.db, server.Config{Jobs: w.sched})
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": flake})
	w.project, w.cache = testworld.Project(t, w.db, w.repo)
	var peers string
	w.proxyID, peers = testworld.Register(t, w.db, w.project.ID)
	_, token, _ := strings.Cut(peers, ":")
	var err error
	if w.tenant, err = p.store.CreateTenant(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := p.store.SetLink(ctx, w.tenant.ID, serverURL, w.proxyID, []proxystore.PeerToken{{PeerID: w.project.ID, Token: token}}); err != nil {
		t.Fatal(err)
	}
	return w
}

// runProxy runs the proxy's legs and hubs over store until the test
// ends; its log is shown when the test fails.
func runProxy(t testing.TB, store *proxystore.Store, heartbeatTimeout time.Duration) (proxyURL string, logs *testlog.Buffer) {
	t.Helper()
	return runProxyIn(t, store, heartbeatTimeout, t.TempDir())
}

// runProxyIn is runProxy with the upstream sessions' temporary directory
// (where a worker stages NARs in transit; the proxy must stage none).
func runProxyIn(t testing.TB, store *proxystore.Store, heartbeatTimeout time.Duration, tempDir string) (proxyURL string, logs *testlog.Buffer) {
	t.Helper()
	logs = &testlog.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	// Debug: the NAR flow test waits for the hub's pause line.
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := hub.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	hubs := hub.NewSet(log, m)
	var sup *upstream.Supervisor
	leg, err := downstream.New(downstream.Config{Store: store, Hubs: hubs, Logger: log,
		PoolChanged: func(id string) { sup.PoolChanged(id) },
		Authority:   authority.Config{HeartbeatTimeout: heartbeatTimeout}})
	if err != nil {
		t.Fatal(err)
	}
	sup, err = upstream.New(upstream.Config{Store: store, Capabilities: upstream.DefaultCapabilities, Pool: leg, Hubs: hubs,
		PollInterval: 50 * time.Millisecond, Logger: log,
		Session: workersession.Config{BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Heartbeat: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(leg.Authority().ProtoHandler())
	runCtx, stop := context.WithCancel(context.Background())
	supDone := make(chan struct{})
	go func() { defer close(supDone); sup.Run(runCtx) }()
	go hubs.Run(runCtx)
	t.Cleanup(func() {
		stop()
		<-supDone
		leg.Close()
		hs.Close()
	})
	return "ws" + strings.TrimPrefix(hs.URL, "http"), logs
}

// startWorker runs a worker behind the proxy (a proxystore row of the
// tenant) with a Nix store of its own; url is where it dials ("" for the
// proxy).
func (w *fedWorld) startWorker(name, url string) string {
	id, _ := w.startWorkerStore(name, url)
	return id
}

// startWorkerStore is startWorker that also returns the worker's store
// directory.
func (w *fedWorld) startWorkerStore(name, url string) (id, store string) {
	w.t.Helper()
	row, token, err := w.store.CreateWorker(w.t.Context(), w.tenant.ID, name, proxystore.Capabilities{Fetch: true, Eval: true, Build: true})
	if err != nil {
		w.t.Fatal(err)
	}
	if url == "" {
		url = w.proxyURL
	}
	n := nixtest.Trusting(w.t, w.cache.PublicKey())
	testworld.RunWorker(w.t, worker.Config{
		Session: workersession.Config{
			ServerURL: url, WorkerID: row.ID, Peers: row.ID + ":" + token,
			Capabilities: wire.GradientCapabilities{Fetch: true, Eval: true, Build: true},
			Heartbeat:    500 * time.Millisecond, BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		},
		CPUCoreScore: 1,
		Executor: &nixexec.Executor{Nix: n, Logger: slog.New(slog.DiscardHandler),
			AllowLocalRepositories: true},
		TempDir: w.t.TempDir(),
	})
	return row.ID, n.Store
}

func (w *fedWorld) evaluate(wildcards ...string) storage.Evaluation {
	w.t.Helper()
	ev, err := w.sched.StartEvaluation(w.t.Context(), storage.NewEvaluation{ProjectID: w.project.ID, RepositoryURL: w.repo, Commit: w.commit, Wildcards: wildcards})
	if err != nil {
		w.t.Fatal(err)
	}
	return ev
}

func (w *fedWorld) waitFor(id, what string, timeout time.Duration, cond func(storage.Evaluation, []storage.Build) bool) (storage.Evaluation, []storage.Build) {
	w.t.Helper()
	return testworld.WaitForEvaluation(w.t, w.db, id, what, timeout, cond)
}

func byAttr(builds []storage.Build) map[string]storage.Build {
	m := map[string]storage.Build{}
	for _, b := range builds {
		m[b.Attr[strings.LastIndex(b.Attr, ".")+1:]] = b
	}
	return m
}

// A tenant's evaluation of a flake with a dependency chain runs on the
// workers behind the proxy exactly as on the server's own: fetched,
// evaluated and built there in order, the outputs uploaded through the
// proxy into the tenant's cache, from where a real Nix copies them.
func TestEvaluationBuildsBehindTheProxy(t *testing.T) {
	w := newFedWorld(t, 0)
	w.startWorker("builder-1", "")
	w.startWorker("builder-2", "")
	ev, builds := w.waitFor(w.evaluate("packages.x86_64-linux.*").ID, "the end", 3*time.Minute,
		func(ev storage.Evaluation, _ []storage.Build) bool { return ev.Status.Terminal() })
	if ev.Status != storage.EvaluationSucceeded {
		log, _ := jobqueue.New(w.db).EvaluationLog(t.Context(), ev.ID)
		t.Fatalf("evaluation %s: %s\nlog:\n%s", ev.Status, ev.Error, log)
	}
	b := byAttr(builds)
	for _, name := range []string{"greeting", "shout", "report"} {
		if b[name].Status != storage.BuildSucceeded || b[name].WorkerID != w.proxyID || len(b[name].OutputInfo) != 1 {
			t.Fatalf("build %s: %+v, want succeeded on the proxy's worker ID", name, b[name])
		}
	}
	if b["shout"].StartedAt.Before(b["greeting"].FinishedAt) || b["report"].StartedAt.Before(b["shout"].FinishedAt) {
		t.Errorf("the chain ran out of order: %+v", b)
	}
	client := nixtest.New(t)
	out := b["report"].OutputInfo[0].StorePath
	if err := client.CopyFrom(t.Context(), w.httpURL+"/cache/main", []string{w.cache.PublicKey()}, out); err != nil {
		t.Fatalf("nix copy from the tenant's cache: %v", err)
	}
	content, err := os.ReadFile(filepath.Join(client.Store, out))
	if err != nil || strings.TrimSpace(string(content)) != "report: hello!" {
		t.Errorf("report's output %q, %v", content, err)
	}
	w.checkNoNARs()
}

// checkNoNARs: the proxy's data and temporary directories hold nothing
// but its database; every NAR passed through.
func (p *proxyWorld) checkNoNARs() {
	p.t.Helper()
	for _, dir := range []string{p.dataDir, p.tempDir} {
		filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && !strings.HasPrefix(d.Name(), "gradient.db") {
				p.t.Errorf("the proxy left %s", path)
			}
			return nil
		})
	}
}

// A worker lost mid-build (its connection dies half-open; the proxy's
// heartbeat timeout drops it) fails the build upstream as transient, and
// the server runs it again on the other worker behind the proxy.
func TestWorkerLostMidBuildFailsTransientUpstream(t *testing.T) {
	w := newFedWorld(t, 2*time.Second)
	cut := halfopen.New(t, strings.TrimPrefix(w.proxyURL, "ws://"))
	w.startWorker("doomed", "ws://"+cut.Addr())
	ev := w.evaluate("checks.x86_64-linux.forever")
	w.waitFor(ev.ID, "forever building", 2*time.Minute, func(_ storage.Evaluation, builds []storage.Build) bool {
		return len(builds) == 1 && builds[0].Status == storage.BuildBuilding
	})
	w.startWorker("spare", "")
	cut.Freeze()
	_, builds := w.waitFor(ev.ID, "a transient failure recorded", time.Minute, func(_ storage.Evaluation, builds []storage.Build) bool {
		return len(builds) == 1 && builds[0].FailureKind == storage.FailureTransient
	})
	if !strings.Contains(builds[0].Error, "worker behind the proxy lost") {
		t.Errorf("the build's error %q does not name the lost worker", builds[0].Error)
	}
	// It runs again, on the spare behind the proxy.
	w.waitFor(ev.ID, "forever building again", time.Minute, func(_ storage.Evaluation, builds []storage.Build) bool {
		return len(builds) == 1 && builds[0].Status == storage.BuildBuilding && builds[0].Attempts >= 1
	})
	if err := w.sched.CancelEvaluation(t.Context(), ev.ID); err != nil {
		t.Fatal(err)
	}
}

// dagFlake is a tenant's own flake: greeting, two parallel leaves on it,
// and a report on both; its outputs differ per tenant.
func dagFlake(tenant string) string {
	return `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
  in {
    packages.${system} = rec {
      greeting = step "greeting" "echo hello from ` + tenant + ` > $out";
      shout = step "shout" "read v < ${greeting}; echo \"$v!\" > $out";
      whisper = step "whisper" "read v < ${greeting}; echo \"($v)\" > $out";
      report = step "report" "read s < ${shout}; read w < ${whisper}; echo \"$s $w\" > $out";
    };
  };
}
`
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Two tenants' evaluations run at once through one proxy: each builds
// entirely on its own tenant's workers (its outputs are in their stores
// and in no other tenant's worker's store), and each output lands in its
// own tenant's cache.
func TestTwoTenantsBuildApartThroughOneProxy(t *testing.T) {
	p := newProxyWorld(t, 0)
	tenants := []*fedWorld{p.addTenant("tenant-a", dagFlake("a")), p.addTenant("tenant-b", dagFlake("b"))}
	stores := make([][]string, len(tenants))
	for i, w := range tenants {
		for j := range 2 - i { // a has two workers, b one
			_, store := w.startWorkerStore(fmt.Sprintf("%s-%d", w.tenant.Name, j), "")
			stores[i] = append(stores[i], store)
		}
	}
	evs := make([]storage.Evaluation, len(tenants))
	for i, w := range tenants {
		evs[i] = w.evaluate("packages.x86_64-linux.*")
	}
	for i, w := range tenants {
		ev, builds := w.waitFor(evs[i].ID, "the end", 3*time.Minute, func(ev storage.Evaluation, _ []storage.Build) bool { return ev.Status.Terminal() })
		if ev.Status != storage.EvaluationSucceeded || len(builds) != 4 {
			t.Fatalf("%s: evaluation %s (%s) with %d builds", w.tenant.Name, ev.Status, ev.Error, len(builds))
		}
		for _, b := range builds {
			out := b.OutputInfo[0].StorePath
			mine, theirs := false, false
			for k, ss := range stores {
				for _, s := range ss {
					if exists(filepath.Join(s, out)) {
						mine = mine || k == i
						theirs = theirs || k != i
					}
				}
			}
			if !mine || theirs {
				t.Errorf("%s's %s: on its own workers %v, on the other tenant's %v", w.tenant.Name, b.Attr, mine, theirs)
			}
		}
		report := byAttr(builds)["report"].OutputInfo[0].StorePath
		client := nixtest.New(t)
		if err := client.CopyFrom(t.Context(), w.httpURL+"/cache/main", []string{w.cache.PublicKey()}, report); err != nil {
			t.Fatalf("nix copy from %s's cache: %v", w.tenant.Name, err)
		}
		want := fmt.Sprintf("hello from %s! (hello from %s)", w.tenant.Name[len("tenant-"):], w.tenant.Name[len("tenant-"):])
		if content, err := os.ReadFile(filepath.Join(client.Store, report)); err != nil || strings.TrimSpace(string(content)) != want {
			t.Errorf("%s's report %q, %v; want %q", w.tenant.Name, content, err, want)
		}
	}
	p.checkNoNARs()
}
