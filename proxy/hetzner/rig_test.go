package hetzner

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/proxy/downstream"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	// proxyworld.Main is sqldbtest.Main, and removes the binaries the
	// end-to-end test built.
	os.Exit(proxyworld.Main(m))
}

// clock is the reconciler's controllable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// demand is a settable Demand.
type demand struct {
	mu      sync.Mutex
	pending map[string]map[string]int
}

func (d *demand) set(tenantID, system string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending[tenantID] == nil {
		d.pending[tenantID] = map[string]int{}
	}
	d.pending[tenantID][system] = n
}

func (d *demand) PendingJobs(tenantID string) map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]int{}
	for k, v := range d.pending[tenantID] {
		out[k] = v
	}
	return out
}

// legSessions is the real downstream leg; Busy can be forced per worker
// (the proxy forwards no jobs yet, so no real worker is ever busy), and
// Drains that reached a session are recorded.
type legSessions struct {
	leg atomic.Pointer[downstream.Leg]

	mu      sync.Mutex
	busy    map[string]bool
	drained map[string]int
}

func (s *legSessions) Connected(id string) bool { return s.leg.Load().Connected(id) }
func (s *legSessions) Busy(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy[id] || s.leg.Load().Busy(id)
}
func (s *legSessions) Drain(id string) bool {
	ok := s.leg.Load().Drain(id)
	if ok {
		s.mu.Lock()
		s.drained[id]++
		s.mu.Unlock()
	}
	return ok
}
func (s *legSessions) Revoke(ctx context.Context, id string) error {
	return s.leg.Load().Revoke(ctx, id)
}

func (s *legSessions) setBusy(id string, busy bool) {
	s.mu.Lock()
	s.busy[id] = busy
	s.mu.Unlock()
}

func (s *legSessions) drains(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drained[id]
}

// rig is a proxy's downstream leg on loopback, its store, a fake
// Hetzner API whose "VMs" run real workers from their user data, and a
// reconciler on a controllable clock.
type rig struct {
	t        testing.TB
	dbURL    string
	box      *sealbox.Box
	store    *proxystore.Store
	clock    *clock
	cloud    *fakeCloud
	demand   *demand
	sessions *legSessions
	protoURL string
	handler  atomic.Pointer[http.Handler]
	rec      *Reconciler
	registry *prometheus.Registry

	mu sync.Mutex
	// dead tenants' VMs never start their worker.
	dead map[string]bool
	vms  map[int64]*vm
}

// vm is a fake VM's worker process.
type vm struct {
	env  map[string]string
	stop func()
}

func newRig(t testing.TB, dbURL string) *rig {
	t.Helper()
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, dbURL: dbURL, box: box, clock: &clock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)},
		demand: &demand{pending: map[string]map[string]int{}}, dead: map[string]bool{}, vms: map[int64]*vm{},
		sessions: &legSessions{busy: map[string]bool{}, drained: map[string]int{}}}
	r.cloud = newFakeCloud(t, r.clock.Now)
	r.cloud.addImage(90, "x86", "gradient-worker", r.clock.Now().Add(-48*time.Hour), "available")
	r.cloud.addImage(100, "x86", "gradient-worker", r.clock.Now().Add(-24*time.Hour), "available")
	r.cloud.addImage(110, "x86", "gradient-worker", r.clock.Now().Add(-time.Hour), "creating")
	r.cloud.addImage(200, "arm", "gradient-worker", r.clock.Now().Add(-24*time.Hour), "available")
	r.cloud.onCreate, r.cloud.onDelete = r.boot, r.halt
	r.openStore()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { (*r.handler.Load()).ServeHTTP(w, req) }))
	t.Cleanup(hs.Close)
	r.protoURL = "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
	r.start()
	t.Cleanup(func() {
		r.refuseProto()
		r.stopVMs()
		r.sessions.leg.Load().Close()
	})
	return r
}

func (r *rig) openStore() {
	s, err := proxystore.Open(r.t.Context(), r.dbURL, r.box)
	if err != nil {
		r.t.Fatal(err)
	}
	r.store = s
	r.t.Cleanup(func() { s.Close() })
}

// start runs a proxy: a downstream leg behind /proto and a reconciler,
// on the rig's store.
func (r *rig) start() {
	t := r.t
	leg, err := downstream.New(downstream.Config{Store: r.store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r.sessions.leg.Store(leg)
	h := leg.Authority().ProtoHandler()
	r.handler.Store(&h)
	r.registry = prometheus.NewRegistry()
	client := NewClient(r.cloud.srv.URL, "test-token", nil)
	r.rec, err = New(Config{Store: r.store, Client: client, Sessions: r.sessions, Demand: r.demand, ProtoURL: r.protoURL,
		Now: r.clock.Now, Logger: slog.New(slog.DiscardHandler), Metrics: r.registry})
	if err != nil {
		t.Fatal(err)
	}
}

// restart stops the proxy (its leg closes every session) and starts a
// new one on a freshly opened store: nothing but the database and the
// cloud carries over.
func (r *rig) restart() {
	r.refuseProto()
	r.sessions.leg.Load().Close()
	r.store.Close()
	r.openStore()
	r.start()
}

// refuseProto answers /proto with 503 (the proxy is down), so no
// handshake reaches a leg being closed.
func (r *rig) refuseProto() {
	var down http.Handler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "proxy down", http.StatusServiceUnavailable)
	})
	r.handler.Store(&down)
}

// tenant makes a tenant with a link that connects and an enabled
// configuration: x86_64-linux on cx22 with 2 slots, max VMs 3, the
// snapshot by label.
func (r *rig) tenant(name string) proxystore.Tenant {
	t, ctx := r.t, r.t.Context()
	tenant, err := r.store.CreateTenant(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.SetLink(ctx, tenant.ID, "ws://127.0.0.1:9/proto", sqldb.NewID(),
		[]proxystore.PeerToken{{PeerID: sqldb.NewID(), Token: strings.Repeat("a", 64)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.SetHetznerConfig(ctx, tenant.ID, proxystore.HetznerConfig{Enabled: true, MaxVMs: 3,
		SnapshotLabel: "gradient-worker", SSHKeys: []int64{7}, Labels: map[string]string{"owner": name},
		Systems: map[string]proxystore.HetznerSystem{"x86_64-linux": {ServerType: "cx22", Location: "fsn1", Slots: 2}},
		Allowed: proxystore.Capabilities{Build: true}}); err != nil {
		t.Fatal(err)
	}
	return tenant
}

// noWorkers makes the tenant's VMs never start their worker.
func (r *rig) noWorkers(tenantID string) {
	r.mu.Lock()
	r.dead[tenantID] = true
	r.mu.Unlock()
}

// parseEnv reads the env file out of a #cloud-config user data.
func parseEnv(t testing.TB, userData string) map[string]string {
	t.Helper()
	if !strings.HasPrefix(userData, "#cloud-config\n") {
		t.Fatalf("user data is no #cloud-config:\n%s", userData)
	}
	env := map[string]string{}
	inFile, inContent := false, false
	sc := bufio.NewScanner(strings.NewReader(userData))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "  - path: "+EnvFile:
			inFile = true
		case inFile && strings.TrimSpace(line) == "content: |":
			inContent = true
		case inContent && strings.HasPrefix(line, "      "):
			k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
			if !ok {
				t.Fatalf("env line %q is not KEY=VALUE", line)
			}
			env[k] = v
		case inContent:
			inContent, inFile = false, false
		}
	}
	if len(env) == 0 {
		t.Fatalf("no %s in the user data:\n%s", EnvFile, userData)
	}
	return env
}

// boot is the fake VM's start: unless its tenant is dead, a real worker
// runs from the env file the user data writes, as the snapshot's unit
// would run gradient-worker.
func (r *rig) boot(s *fakeServer) {
	env := parseEnv(r.t, s.UserData)
	v := &vm{env: env, stop: func() {}}
	r.mu.Lock()
	r.vms[s.ID] = v
	dead := r.dead[s.Labels[LabelTenant]]
	r.mu.Unlock()
	if dead {
		return
	}
	slots, err := strconv.Atoi(env[EnvMaxBuilds])
	if err != nil {
		r.t.Errorf("the env file's %s: %v", EnvMaxBuilds, err)
		return
	}
	w, err := worker.New(worker.Config{
		Session: workersession.Config{
			ServerURL: env[EnvServerURL], WorkerID: env[EnvWorkerID], Peers: env[EnvPeers],
			Capabilities:   wire.GradientCapabilities{Build: true},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: time.Hour,
			Logger: slog.New(slog.DiscardHandler),
		},
		Architectures: []string{"x86_64-linux"}, MaxBuilds: slots, CPUCoreScore: 100,
	})
	if err != nil {
		r.t.Errorf("the VM's worker does not start: %v", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	var once sync.Once
	v.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				r.t.Error("a VM's worker did not stop within 30 s")
			}
		})
	}
}

// halt is the fake VM's end: its worker stops.
func (r *rig) halt(s *fakeServer) {
	r.mu.Lock()
	v := r.vms[s.ID]
	delete(r.vms, s.ID)
	r.mu.Unlock()
	if v != nil {
		go v.stop()
	}
}

func (r *rig) stopVMs() {
	r.mu.Lock()
	vms := make([]*vm, 0, len(r.vms))
	for _, v := range r.vms {
		vms = append(vms, v)
	}
	r.vms = map[int64]*vm{}
	r.mu.Unlock()
	for _, v := range vms {
		v.stop()
	}
}

func (r *rig) env(serverID int64) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v := r.vms[serverID]; v != nil {
		return v.env
	}
	return nil
}

func (r *rig) pass() {
	r.t.Helper()
	if err := r.rec.Pass(r.t.Context()); err != nil {
		r.t.Fatalf("pass: %v", err)
	}
}

// rows are the tenant's open VM rows.
func (r *rig) rows(tenantID string) []proxystore.VMUsage {
	r.t.Helper()
	open, err := r.store.OpenVMs(r.t.Context())
	if err != nil {
		r.t.Fatal(err)
	}
	var out []proxystore.VMUsage
	for _, v := range open {
		if v.TenantID == tenantID {
			out = append(out, v)
		}
	}
	return out
}

func (r *rig) usage(tenantID string) []proxystore.VMUsage {
	r.t.Helper()
	list, err := r.store.VMUsages(r.t.Context(), tenantID)
	if err != nil {
		r.t.Fatal(err)
	}
	return list
}

// crash stops the VM's worker and leaves its server running: the worker
// process died on a VM that still bills.
func (r *rig) crash(serverID int64) {
	r.mu.Lock()
	v := r.vms[serverID]
	r.mu.Unlock()
	if v == nil {
		r.t.Fatalf("no VM %d to crash", serverID)
	}
	v.stop()
}
