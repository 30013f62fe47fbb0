package worker

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server"
)

// 160 idle, unauthenticated sockets from five loopback addresses (one
// /24, as an attacker's neighbouring addresses are) under the default
// limits: each is admitted by closing the oldest of its prefix instead of
// a 503, so the flood holds at most its prefix's share, and a real worker
// (from the same /24 even) connects and authenticates while the flood
// keeps its sockets open.
func TestPreauthFloodFromFiveAddressesLeavesWorkersAbleToConnect(t *testing.T) {
	t.Parallel()
	r := newRealServer(t, openSQLite(t), server.Config{})

	var idle []*websocket.Conn
	t.Cleanup(func() {
		for _, c := range idle {
			c.Close()
		}
	})
	for i := range 160 {
		from := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%5))}
		flooder := &websocket.Dialer{NetDialContext: (&net.Dialer{LocalAddr: from}).DialContext}
		c, resp, err := flooder.DialContext(t.Context(), r.url, nil)
		if err != nil {
			status := 0
			if resp != nil {
				status = resp.StatusCode
			}
			t.Fatalf("flood socket %d from %s: %v (HTTP %d), want it admitted by shedding an older one", i, from.IP, err, status)
		}
		idle = append(idle, c)
	}

	cfg := testConfig(t, r.url, newBlockingExecutor())
	cfg.Session.PeersFile = filepath.Join(t.TempDir(), "peers")
	token := r.register(r.project.ID, cfg.Session.WorkerID)
	if err := os.WriteFile(cfg.Session.PeersFile, []byte(r.project.ID+":"+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startWorker(t, cfg)
	waitfor.True(t, "the worker live while the flood holds its sockets", func() bool { return r.srv.WorkerStatus(cfg.Session.WorkerID).Live })

	// The oldest flood socket was closed by the server (after its
	// version agreement frame) with 1013.
	var closeErr *websocket.CloseError
	for range 3 {
		if _, _, err := idle[0].ReadMessage(); err != nil {
			if !errors.As(err, &closeErr) || closeErr.Code != websocket.CloseTryAgainLater {
				t.Fatalf("the oldest flood socket ended with %v, want close code 1013", err)
			}
			break
		}
	}
	if closeErr == nil {
		t.Fatal("the oldest flood socket is still open")
	}
	if got := scrapeCounter(t, "http://"+r.addr+"/metrics", `gradient_server_connections_shed_total{reason="address prefix limit"}`); got < 128 {
		t.Fatalf("%v sockets counted as shed, want at least 128", got)
	}
}

// scrapeCounter reads one series' value from a /metrics page.
func scrapeCounter(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return f
		}
	}
	t.Fatalf("no %s in:\n%s", series, body)
	return 0
}
