package downstream

import (
	"context"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/workersession"
)

// runHeartbeatingWorker is a real worker behind the proxy that sends its
// heartbeat (WorkerMetrics) every few milliseconds.
func runHeartbeatingWorker(t *testing.T, proxyURL, workerID, token string, score uint32) {
	t.Helper()
	w, err := worker.New(worker.Config{
		Session: workersession.Config{
			ServerURL: proxyURL, WorkerID: workerID, Peers: workerID + ":" + token,
			Capabilities:   wire.GradientCapabilities{Build: true},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: 20 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler),
		},
		Architectures: []string{"x86_64-linux"}, MaxBuilds: 1, CPUCoreScore: score,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// The tenant's server gets its pool's hardware as the workers really
// sent it — CPUs and RAM summed, the fastest core — and, once the
// workers' heartbeats came, their free RAM; the heartbeats themselves
// are no pool changes, so the upstream session does not re-send the
// aggregate for each of them.
func TestDownstreamHeartbeatsReachTheAggregateWithoutResends(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		pw := newProxyWorld(t, dbURL)
		rowSlow, tokenSlow := createWorker(t, pw.store, pw.tenantA.ID, "slow", proxystore.Capabilities{Build: true})
		rowFast, tokenFast := createWorker(t, pw.store, pw.tenantA.ID, "fast", proxystore.Capabilities{Build: true})
		waitfor.True(t, "the upstream session of tenant A", func() bool { return pw.server.Host(pw.proxyIDA) != nil })
		runHeartbeatingWorker(t, pw.proxyURL, rowSlow.ID, tokenSlow, 100)
		runHeartbeatingWorker(t, pw.proxyURL, rowFast.ID, tokenFast, 250)

		// Many heartbeats reach the proxy ...
		waitfor.True(t, "40 heartbeats at the proxy", func() bool {
			return pw.leg.Authority().ForTest().MessagesReceived("WorkerMetrics") >= 40
		})
		// (Under load one worker alone may send the 40: wait for both.)
		var ramTotal uint64
		waitfor.True(t, "both workers in the pool with their host and a heartbeat", func() bool {
			members := pw.leg.Members(pw.tenantA.ID)
			ramTotal = 0
			for _, m := range members {
				if m.Host == nil || m.Metrics == nil {
					return false
				}
				ramTotal += m.Host.RAMTotalMB
			}
			return len(members) == 2
		})
		// ... and the server has the pool's hardware and load.
		waitfor.True(t, "A's aggregate with both workers' load", func() bool {
			h, load := pw.server.Host(pw.proxyIDA), pw.server.Metrics(pw.proxyIDA)
			return h != nil && h.CPUCount == uint32(2*runtime.NumCPU()) && load != nil && load.RAMFreeMB > 0
		})
		if h := pw.server.Host(pw.proxyIDA); h.RAMTotalMB != ramTotal || h.CPUCoreScore != 250 || h.MaxConcurrentBuilds != 2 {
			t.Errorf("aggregate %+v, want RAM %d MB summed, core score 250 (the fastest), 2 slots", h, ramTotal)
		}
		// Pool changes: two joins, two WorkerCapabilities, two first
		// heartbeats; the session start sends one more.
		if n := pw.server.Received(pw.proxyIDA, "WorkerMetrics"); n > 7 {
			t.Errorf("the server got %d WorkerMetrics for 40 downstream heartbeats, want at most 7 (one per pool change)", n)
		}
	})
}
