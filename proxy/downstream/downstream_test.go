package downstream

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/authority/authoritytest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/proxy/upstream"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(sqldbtest.Main(m))
}

// proxyWorld is one real server with two projects, each of which
// registered a proxy worker ID; tenants A and B link to them, and the
// proxy runs both legs on one store.
type proxyWorld struct {
	store      *proxystore.Store
	server     *authoritytest.HostRecorder
	leg        *Leg
	proxyURL   string
	tenantA    proxystore.Tenant
	tenantB    proxystore.Tenant
	proxyIDA   string
	proxyIDB   string
	supervisor *upstream.Supervisor
}

func newProxyWorld(t *testing.T, dbURL string) *proxyWorld {
	t.Helper()
	ctx := t.Context()
	pw := &proxyWorld{server: authoritytest.NewHostRecorder()}
	db := testworld.Open(t, dbURL)
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	if pw.store, err = proxystore.Open(ctx, dbURL, box); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pw.store.Close() })
	serverURL, _ := testworld.Serve(t, db, server.Config{Jobs: pw.server})

	projectA, cache := testworld.Project(t, db, "https://example.invalid/a.git")
	projectB, err := db.CreateProject(ctx, storage.NewProject{TeamID: projectA.TeamID, Name: "demo-b", Repository: "https://example.invalid/b.git", Branch: "master"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SubscribeProject(ctx, projectB.ID, cache.ID); err != nil {
		t.Fatal(err)
	}
	link := func(name string, project storage.Project) (proxystore.Tenant, string) {
		proxyID, peers := testworld.Register(t, db, project.ID)
		_, token, _ := strings.Cut(peers, ":")
		tenant, err := pw.store.CreateTenant(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pw.store.SetLink(ctx, tenant.ID, serverURL, proxyID, []proxystore.PeerToken{{PeerID: project.ID, Token: token}}); err != nil {
			t.Fatal(err)
		}
		return tenant, proxyID
	}
	pw.tenantA, pw.proxyIDA = link("tenant-a", projectA)
	pw.tenantB, pw.proxyIDB = link("tenant-b", projectB)

	quiet := slog.New(slog.DiscardHandler)
	// The leg tells the supervisor of pool changes; the supervisor
	// reads the leg's pools. The closure is set before anything runs.
	var sup *upstream.Supervisor
	if pw.leg, err = New(Config{Store: pw.store, PoolChanged: func(tenant string) { sup.PoolChanged(tenant) }, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	sup, err = upstream.New(upstream.Config{
		Store: pw.store, Capabilities: upstream.DefaultCapabilities, Pool: pw.leg, PollInterval: 20 * time.Millisecond,
		Session: workersession.Config{BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: time.Hour},
		Logger:  quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	pw.supervisor = sup
	hs := httptest.NewServer(pw.leg.Authority().ProtoHandler())
	pw.proxyURL = "ws" + strings.TrimPrefix(hs.URL, "http")
	supCtx, stop := context.WithCancel(context.Background())
	supDone := make(chan error, 1)
	go func() { supDone <- sup.Run(supCtx) }()
	t.Cleanup(func() {
		stop()
		<-supDone
		pw.leg.Close()
		hs.Close()
	})
	return pw
}

// downstreamWorker is a real worker behind the proxy, configured as
// gradient-worker would be: the proxy's /proto and WORKER_ID:TOKEN.
type downstreamWorker struct {
	stop     func()
	mu       sync.Mutex
	rejected *uint16
	done     chan struct{}
}

func (d *downstreamWorker) rejection() (uint16, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rejected == nil {
		return 0, false
	}
	return *d.rejected, true
}

func runWorker(t *testing.T, proxyURL, workerID, token, arch string, slots int) *downstreamWorker {
	t.Helper()
	d := &downstreamWorker{done: make(chan struct{})}
	w, err := worker.New(worker.Config{
		Session: workersession.Config{
			ServerURL: proxyURL, WorkerID: workerID, Peers: workerID + ":" + token,
			Capabilities:   wire.GradientCapabilities{Federate: true, Fetch: true, Eval: true, Build: true},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: time.Hour,
			OnRejected: func(code uint16, _ string) bool {
				d.mu.Lock()
				defer d.mu.Unlock()
				d.rejected = &code
				return true
			},
			Logger: slog.New(slog.DiscardHandler),
		},
		Architectures: []string{arch}, MaxBuilds: slots, CPUCoreScore: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { defer close(d.done); w.Run(ctx) }()
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-d.done:
			case <-time.After(30 * time.Second):
				t.Error("worker did not stop within 30 s")
			}
		})
	}
	t.Cleanup(d.stop)
	return d
}

func createWorker(t *testing.T, s *proxystore.Store, tenant, name string, allowed proxystore.Capabilities) (proxystore.Worker, string) {
	t.Helper()
	w, token, err := s.CreateWorker(t.Context(), tenant, name, allowed)
	if err != nil {
		t.Fatal(err)
	}
	return w, token
}

// A downstream worker counts in its own tenant's aggregate at the
// tenant's server while it is connected, never in another tenant's; its
// capabilities are its offer AND the row's allowed set, federate off.
func TestDownstreamWorkersFormTheirTenantsAggregate(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		pw := newProxyWorld(t, dbURL)
		rowA, tokenA := createWorker(t, pw.store, pw.tenantA.ID, "a1", proxystore.Capabilities{Fetch: true, Build: true})
		rowB, tokenB := createWorker(t, pw.store, pw.tenantB.ID, "b1", proxystore.Capabilities{Build: true})

		workerB := runWorker(t, pw.proxyURL, rowB.ID, tokenB, "aarch64-linux", 3)
		waitfor.True(t, "B's aggregate on the server", func() bool {
			h := pw.server.Host(pw.proxyIDB)
			return h != nil && slices.Equal(h.Architectures, []string{"aarch64-linux"}) && h.MaxConcurrentBuilds == 3
		})
		workerA := runWorker(t, pw.proxyURL, rowA.ID, tokenA, "x86_64-linux", 2)
		waitfor.True(t, "A's aggregate on the server", func() bool {
			h := pw.server.Host(pw.proxyIDA)
			return h != nil && slices.Equal(h.Architectures, []string{"x86_64-linux"}) && h.MaxConcurrentBuilds == 2
		})
		members := pw.leg.Members(pw.tenantA.ID)
		if len(members) != 1 {
			t.Fatalf("tenant A has %d members, want its one worker", len(members))
		}
		// Core and cache are the proxy's own side of the negotiation.
		if c := members[0].Capabilities; c.Federate || !c.Fetch || c.Eval || !c.Build {
			t.Errorf("negotiated %+v, want fetch and build only (offer AND allowed, federate off)", c)
		}
		if h := pw.server.Host(pw.proxyIDB); !slices.Equal(h.Architectures, []string{"aarch64-linux"}) || h.MaxConcurrentBuilds != 3 {
			t.Errorf("B's aggregate %+v counts A's worker", h)
		}

		// Leaving empties A's aggregate and leaves B's alone.
		workerA.stop()
		waitfor.True(t, "A's aggregate empty after its worker left", func() bool {
			h := pw.server.Host(pw.proxyIDA)
			return h != nil && len(h.Architectures) == 0 && h.MaxConcurrentBuilds == 0
		})
		if h := pw.server.Host(pw.proxyIDB); h == nil || h.MaxConcurrentBuilds != 3 {
			t.Errorf("B's aggregate %+v changed when A's worker left", h)
		}
		workerB.stop()
	})
}

// An unknown worker ID gets 403, a wrong token 401; revoking a row
// closes the worker's live session within a second and keeps it out.
func TestDownstreamAdmissionAndRevoke(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		pw := newProxyWorld(t, dbURL)
		row, token := createWorker(t, pw.store, pw.tenantA.ID, "a1", proxystore.Capabilities{Build: true})

		unknown := runWorker(t, pw.proxyURL, storage.NewID(), token, "x86_64-linux", 1)
		waitfor.True(t, "the unknown worker rejected", func() bool { _, ok := unknown.rejection(); return ok })
		if code, _ := unknown.rejection(); code != 403 {
			t.Errorf("unknown worker ID rejected with %d, want 403", code)
		}
		wrong := runWorker(t, pw.proxyURL, row.ID, "not-"+token, "x86_64-linux", 1)
		waitfor.True(t, "the wrong token rejected", func() bool { _, ok := wrong.rejection(); return ok })
		if code, _ := wrong.rejection(); code != 401 {
			t.Errorf("wrong token rejected with %d, want 401", code)
		}

		good := runWorker(t, pw.proxyURL, row.ID, token, "x86_64-linux", 1)
		waitfor.True(t, "the worker live", func() bool { return pw.leg.Authority().WorkerStatus(row.ID).Live })
		if err := pw.leg.Revoke(t.Context(), row.ID); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Second)
		for pw.leg.Authority().WorkerStatus(row.ID).Live || len(pw.leg.Members(pw.tenantA.ID)) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("the revoked worker's session still open a second after Revoke")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if st := pw.leg.Authority().WorkerStatus(row.ID); !strings.Contains(st.OfflineReason, RevokedReason) {
			t.Errorf("offline reason %q, want %q", st.OfflineReason, RevokedReason)
		}
		// Reconnecting, the revoked worker is unknown.
		waitfor.True(t, "the revoked worker's redial rejected", func() bool { _, ok := good.rejection(); return ok })
		if code, _ := good.rejection(); code != 403 {
			t.Errorf("revoked worker redialing rejected with %d, want 403", code)
		}
	})
}
