package upstream

import (
	"context"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"

	"gradient.dev/gradient/authority/authoritytest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) {
	// Every test opens databases; their info lines would bury failures.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(sqldbtest.Main(m))
}

// fixedPool is a tenant's pool set by the test, until the downstream leg
// exists.
type fixedPool struct {
	mu      sync.Mutex
	members map[string][]Member
}

func (p *fixedPool) Members(tenantID string) []Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.members[tenantID])
}

func (p *fixedPool) set(tenantID string, members ...Member) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.members == nil {
		p.members = map[string][]Member{}
	}
	p.members[tenantID] = members
}

// countingListener counts the connections a server accepted: the
// proxy's dials.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// world is a tenant's real server with a project that registered the
// proxy's worker ID, and the proxy's store with the tenant and its link,
// both on one fresh database.
type world struct {
	db       *storage.DB
	store    *proxystore.Store
	srv      *server.Server
	jobs     *authoritytest.HostRecorder
	dials    *countingListener
	url      string
	project  storage.Project
	proxyID  string
	token    string // the project's token for the proxy's ID
	tenant   proxystore.Tenant
	pool     *fixedPool
	sup      *Supervisor
	logs     *testlog.Buffer // the proxy's
	srvLogs  *testlog.Buffer
	stopProx func()
}

func newWorld(t *testing.T, dbURL string) *world {
	t.Helper()
	ctx := t.Context()
	w := &world{jobs: authoritytest.NewHostRecorder(), pool: &fixedPool{}}
	w.db = testworld.Open(t, dbURL)
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	if w.store, err = proxystore.Open(ctx, dbURL, box); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.store.Close() })

	w.project, _ = testworld.Project(t, w.db, "https://example.invalid/demo.git")
	peers := ""
	w.proxyID, peers = testworld.Register(t, w.db, w.project.ID)
	_, w.token, _ = strings.Cut(peers, ":")

	nars, err := narstore.OpenLocal(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var srvLog *slog.Logger
	srvLog, w.srvLogs = testlog.New(t, "server")
	w.srv = server.New(w.db, server.Config{Jobs: w.jobs, NarStore: nars, Logger: srvLog})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.dials = &countingListener{Listener: ln}
	hs := httptest.NewUnstartedServer(w.srv.Handler())
	hs.Listener.Close()
	hs.Listener = w.dials
	hs.Start()
	t.Cleanup(func() { w.srv.Close(); hs.Close() })
	w.url = "ws://" + ln.Addr().String() + "/proto"

	if w.tenant, err = w.store.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	w.setLink(t, w.token)
	return w
}

func (w *world) setLink(t *testing.T, token string) {
	t.Helper()
	if _, err := w.store.SetLink(t.Context(), w.tenant.ID, w.url, w.proxyID, []proxystore.PeerToken{{PeerID: w.project.ID, Token: token}}); err != nil {
		t.Fatal(err)
	}
}

// runProxy runs the supervisor until the test ends.
func (w *world) runProxy(t *testing.T) {
	t.Helper()
	var log *slog.Logger
	log, w.logs = testlog.New(t, "proxy")
	sup, err := New(Config{
		Store: w.store, Capabilities: DefaultCapabilities, Pool: w.pool, PollInterval: 20 * time.Millisecond,
		Session: workersession.Config{BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: time.Hour},
		Logger:  log,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.sup = sup
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	var once sync.Once
	w.stopProx = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("the supervisor did not stop")
			}
		})
	}
	t.Cleanup(w.stopProx)
}

func (w *world) live() bool {
	st := w.srv.WorkerStatus(w.proxyID)
	return st.Live && slices.Equal(st.Projects, []string{w.project.ID})
}

func (w *world) link(t *testing.T) proxystore.Link {
	t.Helper()
	l, err := w.store.Link(t.Context(), w.tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func poolHost(archs []string, slots, cpus uint32, ram uint64, score uint32) *wire.WorkerCapabilities {
	return &wire.WorkerCapabilities{Architectures: archs, SystemFeatures: []string{"kvm"}, MaxConcurrentBuilds: slots, CPUCount: cpus, RAMTotalMB: ram, CPUCoreScore: score}
}

// The proxy holds one worker session for the tenant: the tenant's
// server shows the proxy's ID live for the project with the pool's
// aggregate, a pool change re-sends it, and disabling the link or the
// tenant's may-run closes the session until they are on again.
func TestSupervisorHoldsTheTenantsSession(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		ctx := t.Context()
		w := newWorld(t, dbURL)
		build := wire.GradientCapabilities{Build: true}
		w.pool.set(w.tenant.ID,
			Member{Capabilities: build, Host: poolHost([]string{"x86_64-linux"}, 4, 8, 16000, 300)},
			Member{Capabilities: build, Host: poolHost([]string{"aarch64-linux"}, 2, 16, 32000, 500)})
		w.runProxy(t)
		waitfor.True(t, "the proxy live for the project", w.live)
		want := wire.WorkerCapabilities{Architectures: []string{"aarch64-linux", "x86_64-linux"}, SystemFeatures: []string{"kvm"},
			MaxConcurrentBuilds: 6, CPUCount: 24, RAMTotalMB: 48000, CPUCoreScore: 500}
		waitfor.True(t, "the aggregate on the server", func() bool { h := w.jobs.Host(w.proxyID); return h != nil && reflect.DeepEqual(*h, want) })
		// The session's own messages came in: its capabilities are recorded.
		if caps := w.srv.WorkerStatus(w.proxyID).Capabilities; !slices.Contains(caps, "fetch") || !slices.Contains(caps, "eval") ||
			!slices.Contains(caps, "build") || slices.Contains(caps, "federate") {
			t.Fatalf("negotiated capabilities %v, want the fixed fetch, eval, build", caps)
		}
		if l := w.link(t); l.State != proxystore.LinkOK {
			t.Fatalf("link %+v, want ok", l)
		}
		// The operator's view of the session: live, the link's URL, worker
		// ID and peer IDs, never a token.
		waitfor.True(t, "the supervisor's status live", func() bool { st, ok := w.sup.Status(w.tenant.ID); return ok && st.Live })
		if st, _ := w.sup.Status(w.tenant.ID); st.Tenant != "acme" || st.URL != w.url || st.WorkerID != w.proxyID ||
			!slices.Equal(st.Peers, []string{w.project.ID}) || st.ConnectedAt.IsZero() {
			t.Fatalf("status %+v", st)
		}
		if all := w.sup.Statuses(); len(all) != 1 || all[0].TenantID != w.tenant.ID {
			t.Fatalf("statuses %+v, want the tenant's one", all)
		}

		// A third worker joins the pool.
		w.pool.set(w.tenant.ID, append(w.pool.Members(w.tenant.ID),
			Member{Capabilities: build, Host: poolHost([]string{"riscv64-linux"}, 1, 4, 8000, 100)})...)
		w.sup.PoolChanged(w.tenant.ID)
		want.Architectures = []string{"aarch64-linux", "riscv64-linux", "x86_64-linux"}
		want.MaxConcurrentBuilds, want.CPUCount, want.RAMTotalMB = 7, 28, 56000
		waitfor.True(t, "the new aggregate on the server", func() bool { h := w.jobs.Host(w.proxyID); return h != nil && reflect.DeepEqual(*h, want) })
		connectedAt := w.srv.WorkerStatus(w.proxyID).ConnectedAt

		// The tenant's worker series, labelled with the tenant's ID (not
		// its name: /metrics answers without a token).
		if v := gathered(t, w.sup, "gradient_worker_connected", w.tenant.ID); v != 1 {
			t.Fatalf("gradient_worker_connected{tenant=%s} = %v, want 1", w.tenant.ID, v)
		}
		if !w.srv.WorkerStatus(w.proxyID).ConnectedAt.Equal(connectedAt) {
			t.Fatal("a pool change reconnected the session; it must re-send on the live one")
		}

		if _, err := w.store.DisableLink(ctx, w.tenant.ID); err != nil {
			t.Fatal(err)
		}
		waitfor.True(t, "the session closed after disabling the link", func() bool { return !w.srv.WorkerStatus(w.proxyID).Live })
		waitfor.True(t, "no status for a disabled link", func() bool { _, ok := w.sup.Status(w.tenant.ID); return !ok })
		if _, err := w.store.EnableLink(ctx, w.tenant.ID); err != nil {
			t.Fatal(err)
		}
		waitfor.True(t, "the session back after enabling the link", w.live)

		if _, err := w.store.SetTenantMayRun(ctx, w.tenant.ID, false); err != nil {
			t.Fatal(err)
		}
		waitfor.True(t, "the session closed while the tenant may not run", func() bool { return !w.srv.WorkerStatus(w.proxyID).Live })
		if _, err := w.store.SetTenantMayRun(ctx, w.tenant.ID, true); err != nil {
			t.Fatal(err)
		}
		waitfor.True(t, "the session back when the tenant may run", w.live)

		w.stopProx()
		waitfor.True(t, "the session closed when the proxy stops", func() bool { return !w.srv.WorkerStatus(w.proxyID).Live })
		for _, logs := range []string{w.logs.String(), w.srvLogs.String()} {
			if strings.Contains(logs, w.token) {
				t.Fatal("the upstream token reached a log")
			}
		}
	})
}

// A wrong token: the server's 401 fails the link with its reason, the
// proxy stops dialing, and setting the link again with the right token
// recovers it.
func TestSupervisorStopsOnRejectionUntilTheLinkIsSetAgain(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		w := newWorld(t, dbURL)
		bad, err := secret.Generate()
		if err != nil {
			t.Fatal(err)
		}
		w.setLink(t, bad)
		w.runProxy(t)
		waitfor.True(t, "the link failing", func() bool { return w.link(t).State == proxystore.LinkFailing })
		l := w.link(t)
		if !strings.Contains(l.FailureReason, "401") || !strings.Contains(l.FailureReason, "no valid peer tokens provided") {
			t.Fatalf("failure reason %q, want the server's code and reason", l.FailureReason)
		}
		dials := w.dials.accepted.Load()
		// Many backoff periods (at most 100 ms) and polls (20 ms).
		time.Sleep(time.Second)
		if now := w.dials.accepted.Load(); now != dials || dials != 1 {
			t.Fatalf("the proxy dialed %d times, then %d: a rejected link must not be redialed", dials, now)
		}
		if w.srv.WorkerStatus(w.proxyID).Live {
			t.Fatal("a rejected proxy holds a session")
		}

		w.setLink(t, w.token)
		waitfor.True(t, "the proxy live after the link was set again", w.live)
		waitfor.True(t, "the link ok", func() bool { l := w.link(t); return l.State == proxystore.LinkOK && l.FailureReason == "" })
		for _, secret := range []string{bad, w.token} {
			if strings.Contains(w.logs.String(), secret) {
				t.Fatal("an upstream token reached the proxy's log")
			}
		}
	})
}

// Setting a live link again with a changed token starts a new session
// with it: a wrong token then fails the link with the server's reason
// (a reauth would have kept the old session authorized by the old one),
// and the right one recovers it.
func TestSupervisorChangedTokenStartsANewSession(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		w := newWorld(t, dbURL)
		w.runProxy(t)
		waitfor.True(t, "the proxy live", w.live)
		first := w.srv.WorkerStatus(w.proxyID).ConnectedAt

		bad, err := secret.Generate()
		if err != nil {
			t.Fatal(err)
		}
		w.setLink(t, bad)
		w.sup.Changed()
		waitfor.True(t, "the link failing", func() bool { return w.link(t).State == proxystore.LinkFailing })
		if l := w.link(t); !strings.Contains(l.FailureReason, "401") {
			t.Fatalf("failure reason %q, want the server's 401", l.FailureReason)
		}
		waitfor.True(t, "the old session gone", func() bool { return !w.srv.WorkerStatus(w.proxyID).Live })

		w.setLink(t, w.token)
		w.sup.Changed()
		waitfor.True(t, "the proxy live after the link was set again", w.live)
		if again := w.srv.WorkerStatus(w.proxyID).ConnectedAt; !again.After(first) {
			t.Fatalf("connected at %v, then %v: want a new session", first, again)
		}
	})
}

// A refusal other than 401 or 403 (here 495: the project has no cache)
// leaves the link ok and the proxy dials again with backoff.
func TestSupervisorRedialsOtherRefusals(t *testing.T) {
	t.Parallel()
	w := newWorld(t, sqldbtest.SQLiteURL(t))
	ctx := t.Context()
	team, err := w.db.CreateTeam(ctx, "bare")
	if err != nil {
		t.Fatal(err)
	}
	bare, err := w.db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: "bare", Repository: "https://example.invalid/bare.git", Branch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	_, token, err := w.db.CreateRegistration(ctx, storage.Peer{Kind: storage.PeerProject, ID: bare.ID}, w.proxyID, storage.DefaultWorkerSettings())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.store.SetLink(ctx, w.tenant.ID, w.url, w.proxyID, []proxystore.PeerToken{{PeerID: bare.ID, Token: token}}); err != nil {
		t.Fatal(err)
	}
	w.runProxy(t)
	waitfor.True(t, "three dials", func() bool { return w.dials.accepted.Load() >= 3 })
	if l := w.link(t); l.State != proxystore.LinkOK {
		t.Fatalf("link %+v after a 495, want ok", l)
	}
}

// gathered is the value of a gauge or counter for tenant in g's series.
func gathered(t *testing.T, g *Supervisor, name, tenant string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == tenant {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{tenant=%q} among the gathered series", name, tenant)
	return 0
}
