package hub_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/proxy/downstream"
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/proxy/upstream"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

// A hostile tenant's server floods the proxy with offers and job-list
// pages, each within the protocol's limits (1,000 candidates, under
// 2 MiB a page), through the proxy's real upstream leg. The proxy holds
// no more candidates than its bound, its heap stays bounded, the excess
// is counted and logged once, and another tenant's worker still gets
// its job. Before the bound the proxy kept every candidate: 300 pages
// took it from 62 MB to 1.1 GB.
func TestAFloodingTenantServerCannotExhaustTheProxy(t *testing.T) {
	const (
		bound = 1_000 // the test's BookCandidates
		pages = 12    // of offers, then as many of an endless job list
		per   = wire.MaxCandidatesPerPage
	)
	ctx := t.Context()
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	store, err := proxystore.Open(ctx, storagetest.SQLiteURL(t), box)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })

	reg := prometheus.NewRegistry()
	proxy := runBoundedProxy(t, store, reg, hub.Limits{BookCandidates: bound})

	hostile := newHandServer(t)
	honest := newHandServer(t)
	link := func(name string, s *handServer) proxystore.Tenant {
		tenant, err := store.CreateTenant(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.SetLink(ctx, tenant.ID, s.url, storage.NewID(), []proxystore.PeerToken{{PeerID: storage.NewID(), Token: strings.Repeat("t", 64)}}); err != nil {
			t.Fatal(err)
		}
		return tenant
	}
	attacker := link("attacker", hostile)
	victim := link("victim", honest)
	proxy.sup.Changed()
	up := hostile.session(t)
	victimUp := honest.session(t)

	// The victim's tenant server hands out one build whenever it is
	// polled.
	go func() {
		n := 0
		for m := range victimUp.in {
			if r, ok := m.(*wire.RequestJob); ok && r.Kind == wire.JobKindBuild {
				n++
				victimUp.send(&wire.AssignJob{JobID: fmt.Sprint("victim-job-", n), AssignmentID: fmt.Sprint("as-", n),
					Job: &wire.BuildJob{Requirement: wire.BuildRequirement{Architecture: "x86_64-linux"}}})
			}
		}
	}()
	go func() {
		for range up.in { // the attacker reads nothing
		}
	}()

	before := heapAfterGC()
	start := time.Now()
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		for p := range pages {
			up.send(&wire.JobOffer{Candidates: floodPage(fmt.Sprint("offer-", p), per)})
		}
		for p := range pages {
			up.send(&wire.JobListChunk{Candidates: floodPage(fmt.Sprint("list-", p), per)}) // never final
		}
	}()

	// The victim's worker, by hand, logs in behind the proxy while the
	// flood runs and gets its job.
	row, token, err := store.CreateWorker(ctx, victim.ID, "victim-worker", proxystore.Capabilities{Build: true})
	if err != nil {
		t.Fatal(err)
	}
	w := dialWorker(t, proxy.url, row.ID, token)
	w.send(&wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, MaxConcurrentBuilds: 1, CPUCount: 1})
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if job := w.awaitAssign(t); !strings.HasPrefix(job.JobID, "victim-job-") {
		t.Fatalf("the victim's worker got job %q", job.JobID)
	}

	<-flooded
	// Every candidate was either kept or dropped: the book and the
	// list each keep the bound, the rest is counted.
	dropped := func() float64 {
		return metricValue(t, reg, "gradient_proxy_hub_bounded_total", map[string]string{"tenant": attacker.ID, "bound": "book_candidates"})
	}
	// The last pages may still wait in the socket's buffers.
	waitfor.Within(t, 2*time.Minute, "the flood processed by the proxy", func() bool { return dropped() == 2*(pages*per-bound) })
	if held := metricValue(t, reg, "gradient_proxy_hub_book_candidates", map[string]string{"tenant": attacker.ID}); held != bound {
		t.Errorf("the attacker's book holds %v candidates, want the bound %d", held, bound)
	}
	after := heapAfterGC()
	growth := int64(after) - int64(before)
	t.Logf("heap after GC: %d MiB before the flood of %d candidates, %d MiB after (bound %d candidates)", before>>20, 2*pages*per, after>>20, bound)
	// The book and the list hold 1,000 candidates of ~3 KiB each; all
	// 24,000 took 65 MiB.
	if growth > 24<<20 {
		t.Errorf("the flood grew the proxy's heap by %d MiB, want under 24 MiB", growth>>20)
	}
	lines := strings.Count(proxy.logs.String(), "passes the proxy's bounds")
	if most := 1 + int(time.Since(start)/(10*time.Second)); lines < 1 || lines > most {
		t.Errorf("%d log lines about the bound for %v dropped candidates in %v, want at most one per 10 s", lines, dropped(), time.Since(start))
	}

	// The victim's worker still gets jobs after the flood.
	w.send(&wire.AssignJobResponse{JobID: "victim-job-1", Accepted: false})
	w.send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if job := w.awaitAssign(t); !strings.HasPrefix(job.JobID, "victim-job-") {
		t.Fatalf("after the flood the victim's worker got job %q", job.JobID)
	}
}

// floodPage is a page of candidates as large as the protocol allows: a
// thousand builds with twenty inputs each, just under 2 MiB encoded.
func floodPage(prefix string, n int) []wire.JobCandidate {
	out := make([]wire.JobCandidate, n)
	for i := range out {
		id := fmt.Sprintf("%s-%06d", prefix, i)
		c := wire.JobCandidate{JobID: id,
			DrvPaths:    []string{"/nix/store/" + strings.Repeat("d", 32) + "-" + id + ".drv"},
			OutputPaths: []string{"/nix/store/" + strings.Repeat("o", 32) + "-" + id},
			Requirement: &wire.BuildRequirement{Architecture: "x86_64-linux"}}
		for j := range 20 {
			c.RequiredPaths = append(c.RequiredPaths, wire.RequiredPath{
				Path: fmt.Sprintf("/nix/store/%032d-input-%s-%d", j, id, j), CacheInfo: &wire.CacheInfo{FileSize: 1 << 20, NarSize: 4 << 20}})
		}
		out[i] = c
	}
	if len(wire.CandidatePages(out)) != 1 {
		panic("a flood page passes the protocol's page limits")
	}
	return out
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// metricValue is the summed value of a counter or gauge's series that
// carry labels.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

type boundedProxy struct {
	url  string
	sup  *upstream.Supervisor
	logs *testlog.Buffer
}

// runBoundedProxy runs the proxy's legs and hubs with limits, as
// gradient-proxy does, until the test ends.
func runBoundedProxy(t *testing.T, store *proxystore.Store, reg *prometheus.Registry, limits hub.Limits) *boundedProxy {
	t.Helper()
	p := &boundedProxy{logs: &testlog.Buffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log:\n%s", p.logs.String())
		}
	})
	log := slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	m, err := hub.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	hubs := hub.NewSet(log, m)
	hubs.SetLimits(limits)
	leg, err := downstream.New(downstream.Config{Store: store, Hubs: hubs, Logger: log,
		PoolChanged: func(id string) { p.sup.PoolChanged(id) }, Authority: authority.Config{HeartbeatTimeout: 10 * time.Minute}}) // the hand-written worker sends no heartbeat
	if err != nil {
		t.Fatal(err)
	}
	p.sup, err = upstream.New(upstream.Config{Store: store, Capabilities: upstream.DefaultCapabilities, Pool: leg, Hubs: hubs,
		PollInterval: 50 * time.Millisecond, Logger: log,
		Session: workersession.Config{BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Heartbeat: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(leg.Authority().ProtoHandler())
	runCtx, stop := context.WithCancel(context.Background())
	supDone := make(chan struct{})
	go func() { defer close(supDone); p.sup.Run(runCtx) }()
	go hubs.Run(runCtx)
	t.Cleanup(func() {
		stop()
		<-supDone
		leg.Close()
		hs.Close()
	})
	p.url = "ws" + strings.TrimPrefix(hs.URL, "http")
	return p
}

// handServer is a tenant's Gradient server written by hand: it accepts
// the proxy's upstream session (any tokens) and sends what the test
// says, byte for byte as the wire format has it.
type handServer struct {
	url      string
	sessions chan *handConn
}

type handConn struct {
	c   *websocket.Conn
	ver uint16
	mu  sync.Mutex // writes
	in  chan wire.ClientMessage
}

func newHandServer(t *testing.T) *handServer {
	s := &handServer{sessions: make(chan *handConn, 4)}
	up := websocket.Upgrader{}
	hs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(rw, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_, frame, err := c.ReadMessage()
		if err != nil {
			return
		}
		ver, err := wire.Agree(wire.Supported, frame)
		if err != nil || c.WriteMessage(websocket.BinaryMessage, wire.VersionFrame(wire.Supported)) != nil {
			return
		}
		hc := &handConn{c: c, ver: ver, in: make(chan wire.ClientMessage, 1024)}
		defer close(hc.in)
		if _, ok := hc.read().(*wire.InitConnection); !ok {
			return
		}
		hc.send(&wire.AuthChallenge{Peers: []string{"peer"}})
		if _, ok := hc.read().(*wire.AuthResponse); !ok {
			return
		}
		hc.send(&wire.InitAck{Capabilities: wire.GradientCapabilities{Core: true, Build: true}, AuthorizedPeers: []string{"peer"}})
		s.sessions <- hc
		for {
			m := hc.read()
			if m == nil {
				return
			}
			select {
			case hc.in <- m:
			default: // a reader that does not keep up misses messages
			}
		}
	}))
	t.Cleanup(hs.Close)
	s.url = "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
	return s
}

// session waits for the proxy's upstream session.
func (s *handServer) session(t *testing.T) *handConn {
	t.Helper()
	select {
	case c := <-s.sessions:
		return c
	case <-time.After(time.Minute):
		t.Fatal("the proxy did not connect to the tenant's server")
		return nil
	}
}

func (h *handConn) read() wire.ClientMessage {
	_, frame, err := h.c.ReadMessage()
	if err != nil {
		return nil
	}
	m, err := wire.DecodeClientMessage(frame, h.ver)
	if err != nil {
		return nil
	}
	return m
}

func (h *handConn) send(m wire.ServerMessage) {
	b, err := wire.AppendServerMessage(nil, m, h.ver)
	if err != nil {
		panic(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.c.WriteMessage(websocket.BinaryMessage, b)
}

// handWorker is a worker behind the proxy written by hand.
type handWorker struct {
	c   *websocket.Conn
	ver uint16
}

func dialWorker(t *testing.T, url, workerID, token string) *handWorker {
	t.Helper()
	c, _, err := websocket.DefaultDialer.DialContext(t.Context(), url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	w := &handWorker{c: c}
	if err := c.WriteMessage(websocket.BinaryMessage, wire.VersionFrame(wire.Supported)); err != nil {
		t.Fatal(err)
	}
	if w.ver, err = wire.Agree(wire.Supported, w.frame(t)); err != nil {
		t.Fatal(err)
	}
	w.send(&wire.InitConnection{Capabilities: wire.GradientCapabilities{Build: true}, ID: workerID})
	if _, ok := w.recv(t).(*wire.AuthChallenge); !ok {
		t.Fatal("no AuthChallenge")
	}
	w.send(&wire.AuthResponse{Tokens: []wire.Pair[string, string]{{First: workerID, Second: token}}})
	if ack, ok := w.recv(t).(*wire.InitAck); !ok {
		t.Fatalf("the worker's login answered %#v", ack)
	}
	return w
}

func (w *handWorker) frame(t *testing.T) []byte {
	t.Helper()
	w.c.SetReadDeadline(time.Now().Add(time.Minute))
	_, b, err := w.c.ReadMessage()
	if err != nil {
		t.Fatalf("the worker's read: %v", err)
	}
	return b
}

func (w *handWorker) recv(t *testing.T) wire.ServerMessage {
	t.Helper()
	m, err := wire.DecodeServerMessage(w.frame(t), w.ver)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (w *handWorker) send(m wire.ClientMessage) {
	b, err := wire.AppendClientMessage(nil, m, w.ver)
	if err != nil {
		panic(err)
	}
	w.c.WriteMessage(websocket.BinaryMessage, b)
}

// awaitAssign reads until an AssignJob comes.
func (w *handWorker) awaitAssign(t *testing.T) *wire.AssignJob {
	t.Helper()
	for {
		if a, ok := w.recv(t).(*wire.AssignJob); ok {
			return a
		}
	}
}
