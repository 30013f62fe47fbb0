package worker

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/wire"
)

// rejections records OnRejected calls and answers with stop.
type rejections struct {
	mu    sync.Mutex
	stop  bool
	calls []string // "code reason"
}

func (r *rejections) hook(code uint16, reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("%d %s", code, reason))
	return r.stop
}

func (r *rejections) first() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[0]
}

func (r *rejections) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func wrongToken(t *testing.T) string {
	t.Helper()
	token, err := secret.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// A server's Reject in the handshake reaches OnRejected; returning true
// ends the dialing, where the default keeps backing off and redialing.
func TestOnRejectedStopsDialing(t *testing.T) {
	t.Parallel()
	r := newRealServer(t, openSQLite(t), server.Config{})
	for _, stop := range []bool{false, true} {
		cfg := testConfig(t, r.url, nil)
		r.register(r.project.ID, cfg.Session.WorkerID)
		cfg.Session.Peers = r.project.ID + ":" + wrongToken(t)
		rej := &rejections{stop: stop}
		cfg.Session.OnRejected = rej.hook
		var established atomic.Bool
		cfg.Session.OnEstablished = func() { established.Store(true) }
		startWorker(t, cfg)
		if !stop {
			waitfor.True(t, "three rejected dials", func() bool { return rej.count() >= 3 })
			continue
		}
		waitfor.True(t, "the rejection", func() bool { return rej.count() >= 1 })
		// Several backoff periods (BackoffMax is 200 ms) without a dial.
		time.Sleep(time.Second)
		if n := rej.count(); n != 1 {
			t.Fatalf("the worker dialed %d times after OnRejected stopped it", n)
		}
		if got := rej.first(); !strings.HasPrefix(got, "401 ") {
			t.Fatalf("OnRejected got %q, want the server's 401 and reason", got)
		}
		if established.Load() || r.srv.WorkerStatus(cfg.Session.WorkerID).Live {
			t.Fatal("a rejected worker holds a session")
		}
	}
}

// A Reject during a live session reaches OnRejected too, and a true
// answer means no reconnect.
func TestOnRejectedMidSession(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	cfg := testConfig(t, f.url, nil)
	rej := &rejections{stop: true}
	cfg.Session.OnRejected = rej.hook
	startWorker(t, cfg)
	c := f.accept()
	c.send(t, &wire.ServerReject{Code: 403, Reason: "worker is deactivated"})
	waitfor.True(t, "the rejection", func() bool { return rej.count() == 1 })
	select {
	case <-f.conns:
		t.Fatal("the worker reconnected after OnRejected stopped it")
	case <-time.After(time.Second):
	}
	if got := rej.first(); got != "403 worker is deactivated" {
		t.Fatalf("OnRejected got %q", got)
	}
}

// A handler's Host and Load are what the shell reports; HostChanged
// re-sends both on the live session.
func TestHostSourceAndHostChanged(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	cfg := testConfig(t, f.url, nil)
	h := &recordingHandler{
		host: wire.WorkerCapabilities{Architectures: []string{"riscv64-linux"}, SystemFeatures: []string{}, MaxConcurrentBuilds: 3, CPUCount: 12, RAMTotalMB: 4096, CPUCoreScore: 7},
		free: 100,
	}
	established := make(chan struct{}, 1)
	cfg.Session.OnEstablished = func() { established <- struct{}{} }
	sh := startShell(t, cfg, h)
	c := f.accept()
	recvChan(t, "OnEstablished", established)
	if got := expect[*wire.WorkerCapabilities](t, c); got.MaxConcurrentBuilds != 3 || !slices.Equal(got.Architectures, []string{"riscv64-linux"}) {
		t.Fatalf("first WorkerCapabilities %+v, want the source's", got)
	}
	h.mu.Lock()
	h.host.MaxConcurrentBuilds, h.host.Architectures, h.free = 5, []string{"aarch64-linux", "riscv64-linux"}, 200
	h.mu.Unlock()
	sh.HostChanged()
	if got := expect[*wire.WorkerCapabilities](t, c); got.MaxConcurrentBuilds != 5 || len(got.Architectures) != 2 {
		t.Fatalf("re-sent WorkerCapabilities %+v, want the changed source's", got)
	}
	if got := expect[*wire.WorkerMetrics](t, c); got.RAMFreeMB != 200 {
		t.Fatalf("re-sent WorkerMetrics %+v, want the source's", got)
	}
}

// SetPeers hands the worker new tokens: the live session reauths with
// them, as after a peers file change.
func TestSetPeersReauthorizes(t *testing.T) {
	t.Parallel()
	r := newRealServer(t, openSQLite(t), server.Config{})
	cfg := testConfig(t, r.url, nil)
	first := r.register(r.project.ID, cfg.Session.WorkerID)
	cfg.Session.Peers = r.project.ID + ":" + first
	w, _ := startWorker(t, cfg)
	waitfor.True(t, "the worker live", func() bool { return r.srv.WorkerStatus(cfg.Session.WorkerID).Live })
	connectedAt := r.srv.WorkerStatus(cfg.Session.WorkerID).ConnectedAt
	second := r.register(r.second.ID, cfg.Session.WorkerID)
	w.SetPeers(map[string]string{r.project.ID: first, r.second.ID: second})
	waitfor.True(t, "the second project on the live session", func() bool {
		return slices.Contains(r.srv.WorkerStatus(cfg.Session.WorkerID).Projects, r.second.ID)
	})
	if !r.srv.WorkerStatus(cfg.Session.WorkerID).ConnectedAt.Equal(connectedAt) {
		t.Fatal("the worker reconnected: SetPeers must reauth the live session")
	}
}
