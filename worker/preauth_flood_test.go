package worker

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorilla/websocket"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server"
)

// One client holding idle, unauthenticated sockets from its address gets
// 503 past the per-IP cap, and a real worker from another address still
// connects and authenticates while the flood holds its sockets.
func TestPreauthFloodLeavesWorkersAbleToConnect(t *testing.T) {
	t.Parallel()
	const perIP = 3
	r := newRealServer(t, openSQLite(t), server.Config{MaxConnections: 16, HandshakesPerIP: perIP})

	// The flood dials from another loopback address than the worker.
	flooder := &websocket.Dialer{NetDialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}
	var idle []*websocket.Conn
	t.Cleanup(func() {
		for _, c := range idle {
			c.Close()
		}
	})
	for i := range 17 { // more than MaxConnections
		c, resp, err := flooder.DialContext(t.Context(), r.url, nil)
		if i < perIP {
			if err != nil {
				t.Fatalf("flood socket %d: %v", i, err)
			}
			idle = append(idle, c)
			continue
		}
		if err == nil {
			c.Close()
			t.Fatalf("flood socket %d past the per-IP cap was upgraded", i)
		}
		if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("flood socket %d: %v (response %v), want HTTP 503", i, err, resp)
		}
	}

	cfg := testConfig(t, r.url, newBlockingExecutor())
	cfg.PeersFile = filepath.Join(t.TempDir(), "peers")
	token := r.register(r.project.ID, cfg.WorkerID)
	if err := os.WriteFile(cfg.PeersFile, []byte(r.project.ID+":"+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startWorker(t, cfg)
	waitfor.True(t, "the worker live while the flood holds its sockets", func() bool { return r.srv.WorkerStatus(cfg.WorkerID).Live })

	// Closing a flood socket gives its address a permit back.
	idle[0].Close()
	idle = idle[1:]
	waitfor.True(t, "a freed per-IP permit", func() bool {
		c, _, err := flooder.DialContext(context.Background(), r.url, nil)
		if err != nil {
			return false
		}
		idle = append(idle, c)
		return true
	})
}
