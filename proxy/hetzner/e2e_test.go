package hetzner

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
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
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

// e2eFlake: greeting ← shout, built with nothing but /bin/sh (offline).
const e2eFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
  in {
    packages.${system} = rec {
      greeting = step "greeting" "echo hello from a VM > $out";
      shout = step "shout" "read v < ${greeting}; echo \"$v!\" > $out";
    };
  };
}
`

// From zero VMs to a retired VM, with every part real but Hetzner: a
// tenant's Gradient server (its own worker evaluates, none builds), the
// proxy's two legs with their hubs and the reconciler on a fake Hetzner
// API driven by hcloud-go. The tenant's session advertises the system
// its VMs can boot, so the server offers the evaluation's builds to the
// proxy; the book's demand boots a VM; the VM's gradient-worker process, started from
// the env file in the user data the fake got and nothing else, connects to the
// proxy and builds the flake; the outputs land in the tenant's cache;
// the idle VM goes in its billing unit's last window, its usage row
// closed with one billed unit and its token revoked.
func TestEndToEndFromZeroVMs(t *testing.T) {
	ctx := t.Context()
	quiet := slog.New(slog.DiscardHandler)
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}

	// The tenant's server, with the proxy's registration and an
	// evaluator of its own (fetch and eval, no builds).
	db := testworld.Open(t, sqldbtest.SQLiteURL(t))
	sched := scheduler.New(db, scheduler.Config{Logger: quiet, Tick: 200 * time.Millisecond,
		DeployKeys: deploykeys.New(db, box), RetryBackoff: 200 * time.Millisecond})
	if err := sched.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Close)
	serverURL, httpURL := testworld.Serve(t, db, server.Config{Jobs: sched})
	repo, commit := nixtest.Repo(t, map[string]string{"flake.nix": e2eFlake})
	project, cache := testworld.Project(t, db, repo)
	proxyID, proxyPeers := testworld.Register(t, db, project.ID)
	_, proxyToken, _ := strings.Cut(proxyPeers, ":")
	evalID, evalPeers := testworld.Register(t, db, project.ID)
	testworld.RunWorker(t, worker.Config{
		Session: workersession.Config{
			ServerURL: serverURL, WorkerID: evalID, Peers: evalPeers,
			Capabilities:   wire.GradientCapabilities{Fetch: true, Eval: true},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		},
		CPUCoreScore: 1,
		TempDir:      t.TempDir(),
		Executor:     &nixexec.Executor{Nix: nixtest.New(t), Logger: quiet, AllowLocalRepositories: true},
	})

	// The proxy's database: the tenant, its link, its Hetzner workers.
	store, err := proxystore.Open(ctx, sqldbtest.SQLiteURL(t), box)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	tenant, err := store.CreateTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetLink(ctx, tenant.ID, serverURL, proxyID, []proxystore.PeerToken{{PeerID: project.ID, Token: proxyToken}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetHetznerConfig(ctx, tenant.ID, proxystore.HetznerConfig{Enabled: true, MaxVMs: 2,
		SnapshotLabel: "gradient-worker",
		Systems:       map[string]proxystore.HetznerSystem{x86: {ServerType: "cx22", Location: "fsn1", Slots: 2}},
		Allowed:       proxystore.Capabilities{Build: true}}); err != nil {
		t.Fatal(err)
	}

	// The fake Hetzner API: a created server is a VM whose worker runs
	// from the env file its user data writes, as the snapshot's unit
	// runs gradient-worker; a deleted server's worker stops.
	clk := &clock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	cloud := newFakeCloud(t, clk.Now)
	cloud.addImage(100, "x86", "gradient-worker", clk.Now().Add(-24*time.Hour), "available")
	var vmMu sync.Mutex
	vmStops := map[int64]func(){}
	vmStores := map[int64]string{}
	stopVM := func(id int64) {
		vmMu.Lock()
		stop := vmStops[id]
		delete(vmStops, id)
		vmMu.Unlock()
		if stop != nil {
			stop()
		}
	}
	cloud.onCreate = func(s *fakeServer) {
		env := parseEnv(t, s.UserData)
		if _, err := strconv.Atoi(env[EnvMaxBuilds]); err != nil {
			t.Errorf("the env file's %s: %v", EnvMaxBuilds, err)
			return
		}
		// The VM: a real gradient-worker process whose configuration is
		// the env file's variables and nothing else of the proxy's (as
		// the snapshot's unit reads it), on a chroot store of its own;
		// the flags describe the "machine" (a base directory, no CPU
		// score measurement, the x86_64 system).
		n := nixtest.New(t)
		vmEnv := append(append([]string{}, n.Env...), "NIX_CONFIG="+strings.Join(append([]string{"store = " + n.Store}, nixtest.Config...), "\n"))
		for k, v := range env {
			vmEnv = append(vmEnv, k+"="+v)
		}
		proc := proxyworld.Start(t, fmt.Sprintf("vm-%d", s.ID), "gradient-worker", vmEnv,
			"--base-dir", t.TempDir(), "--gcroots-dir", "", "--system-architectures", x86, "--system-cpu-core-score", "100",
			"--log-level", "info")
		var once sync.Once
		vmMu.Lock()
		vmStores[s.ID] = n.Store
		vmStops[s.ID] = func() { once.Do(proc.Stop) }
		vmMu.Unlock()
	}
	cloud.onDelete = func(s *fakeServer) { go stopVM(s.ID) }

	// The proxy: hubs, both legs, the reconciler.
	hubs := hub.NewSet(quiet, nil)
	var sup *upstream.Supervisor
	var rec *Reconciler
	leg, err := downstream.New(downstream.Config{Store: store, Hubs: hubs, Logger: quiet,
		PoolChanged: func(id string) { sup.PoolChanged(id) }})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(leg.Authority().ProtoHandler())
	protoURL := "ws" + strings.TrimPrefix(hs.URL, "http")
	sup, err = upstream.New(upstream.Config{Store: store, Capabilities: upstream.DefaultCapabilities, Pool: leg, Hubs: hubs,
		Bootable: func(id string) []string { return rec.Bootable(id) }, PollInterval: 50 * time.Millisecond, Logger: quiet,
		Session: workersession.Config{BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Heartbeat: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	rec, err = New(Config{Store: store, Client: NewClient(cloud.srv.URL, "test-token", nil), Sessions: leg, Demand: hubs,
		ProtoURL: protoURL, BootableChanged: sup.PoolChanged, Now: clk.Now, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopProxy := context.WithCancel(context.Background())
	supDone := make(chan struct{})
	go func() { defer close(supDone); sup.Run(runCtx) }()
	go hubs.Run(runCtx)
	t.Cleanup(func() {
		vmMu.Lock()
		ids := make([]int64, 0, len(vmStops))
		for id := range vmStops {
			ids = append(ids, id)
		}
		vmMu.Unlock()
		for _, id := range ids {
			stopVM(id)
		}
		stopProxy()
		<-supDone
		leg.Close()
		hs.Close()
	})
	pass := func() {
		t.Helper()
		if err := rec.Pass(ctx); err != nil {
			t.Fatalf("pass: %v", err)
		}
	}

	// No VM, no worker behind the proxy: the first pass learns what the
	// tenant can boot, and the tenant's session says so upstream.
	pass()
	if n := len(cloud.serversOf(tenant.ID)); n != 0 {
		t.Fatalf("%d servers booted without demand", n)
	}
	ev, err := sched.StartEvaluation(ctx, storage.NewEvaluation{ProjectID: project.ID, RepositoryURL: repo, Commit: commit,
		Wildcards: []string{"packages.x86_64-linux.*"}})
	if err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, "the evaluation's builds in the proxy's offer book", func() bool {
		return hubs.PendingJobs(tenant.ID)[x86] > 0
	})
	pass()
	servers := cloud.serversOf(tenant.ID)
	if len(servers) != 1 {
		t.Fatalf("%d servers booted for the demand %v, want 1", len(servers), hubs.PendingJobs(tenant.ID))
	}
	vm := servers[0]

	// The VM's worker builds the flake through the proxy.
	var builds []storage.Build
	waitfor.True(t, "the evaluation built on the VM", func() bool {
		got, err := jobqueue.New(db).Evaluation(ctx, ev.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Terminal() {
			if got.Status != storage.EvaluationSucceeded {
				log, _ := jobqueue.New(db).EvaluationLog(ctx, ev.ID)
				t.Fatalf("evaluation %s: %s\nlog:\n%s", got.Status, got.Error, log)
			}
			if builds, err = jobqueue.New(db).EvaluationBuilds(ctx, ev.ID); err != nil {
				t.Fatal(err)
			}
			return true
		}
		return false
	})
	vmMu.Lock()
	vmStore := vmStores[vm.ID]
	vmMu.Unlock()
	for _, b := range builds {
		if b.Status != storage.BuildSucceeded || b.WorkerID != proxyID || len(b.OutputInfo) != 1 {
			t.Fatalf("build %s: %+v, want succeeded on the proxy's worker ID", b.Attr, b)
		}
		out := b.OutputInfo[0].StorePath
		if _, err := os.Stat(filepath.Join(vmStore, out)); err != nil {
			t.Errorf("%s was not built on the VM: %v", b.Attr, err)
		}
		resp, err := http.Get(httpURL + "/cache/main/" + strings.TrimPrefix(out, "/nix/store/")[:32] + ".narinfo")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s's output is not in the tenant's cache: %s", b.Attr, resp.Status)
		}
	}
	client := nixtest.New(t)
	var shout string
	for _, b := range builds {
		if strings.HasSuffix(b.Attr, ".shout") {
			shout = b.OutputInfo[0].StorePath
		}
	}
	if err := client.CopyFrom(ctx, httpURL+"/cache/main", []string{cache.PublicKey()}, shout); err != nil {
		t.Fatalf("nix copy from the tenant's cache: %v", err)
	}
	if content, err := os.ReadFile(filepath.Join(client.Store, shout)); err != nil || strings.TrimSpace(string(content)) != "hello from a VM!" {
		t.Errorf("shout's output %q, %v", content, err)
	}

	// Idle: kept until its billing unit's last window, then retired.
	pass()
	rows, err := store.OpenVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ConnectedAt == nil || rows[0].ServerID != vm.ID {
		t.Fatalf("open VM rows %+v, want the connected VM", rows)
	}
	workerID := rows[0].WorkerID
	clk.Advance(DefaultBillingUnit - DefaultScaleDownWindow - time.Minute)
	pass()
	if len(cloud.serversOf(tenant.ID)) != 1 {
		t.Fatal("the idle VM went before its billing unit's last window")
	}
	clk.Advance(2 * time.Minute)
	pass()
	if n := len(cloud.serversOf(tenant.ID)); n != 0 {
		t.Fatalf("%d servers left in the idle VM's last window", n)
	}
	usage, err := store.VMUsages(ctx, tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(usage) != 1 || usage[0].Outcome != proxystore.VMDeleted || usage[0].BilledUnits != 1 || usage[0].DeletedAt == nil {
		t.Fatalf("usage %+v, want one deleted VM billed 1 unit", usage)
	}
	if ws, _ := store.Workers(ctx, tenant.ID); len(ws) != 0 {
		t.Fatalf("the retired VM's worker row stays: %+v", ws)
	}
	waitfor.True(t, "the retired VM's session closed", func() bool { return !leg.Connected(workerID) })
}
