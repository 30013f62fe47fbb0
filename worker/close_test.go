package worker

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"

	"github.com/gorilla/websocket"

	"gradient.dev/gradient/internal/halfopen"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// These tests watch the worker's sockets from a peer that is not ours: a
// bare gorilla connection speaking the wire format by hand, so what it
// reads is exactly what the worker put on the socket.

// bareServer serves /proto with serve on each upgraded connection.
func bareServer(t *testing.T, serve func(c *websocket.Conn)) string {
	up := websocket.Upgrader{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}))
	t.Cleanup(hs.Close)
	return "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
}

// closeFrame reads until the connection ends and returns the peer's close
// frame, or the error when it ended without one (1006).
func closeFrame(c *websocket.Conn) (*websocket.CloseError, error) {
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code == websocket.CloseAbnormalClosure {
			return nil, fmt.Errorf("the connection ended without a close frame: %w", err)
		}
		return ce, nil
	}
}

type closeSeen struct {
	frame *websocket.CloseError
	err   error
}

func wantClose(t *testing.T, seen <-chan closeSeen, code int, reason string) {
	t.Helper()
	got := recvChan(t, "the worker's close frame", seen)
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.frame.Code != code || got.frame.Text != reason {
		t.Fatalf("close frame %d %q, want %d %q", got.frame.Code, got.frame.Text, code, reason)
	}
}

func bareWrite(c *websocket.Conn, m wire.ServerMessage, ver uint16) error {
	b, err := wire.AppendServerMessage(nil, m, ver)
	if err != nil {
		return err
	}
	return c.WriteMessage(websocket.BinaryMessage, b)
}

// bareAuthority agrees on a version and accepts the worker's handshake
// by hand.
func bareAuthority(c *websocket.Conn) error {
	if _, _, err := c.ReadMessage(); err != nil { // the worker's version frame
		return err
	}
	if err := c.WriteMessage(websocket.BinaryMessage, wire.VersionFrame(wire.Supported)); err != nil {
		return err
	}
	ver := wire.Supported.Newest
	if _, _, err := c.ReadMessage(); err != nil { // InitConnection
		return err
	}
	if err := bareWrite(c, &wire.AuthChallenge{Peers: []string{}}, ver); err != nil {
		return err
	}
	if _, _, err := c.ReadMessage(); err != nil { // AuthResponse
		return err
	}
	return bareWrite(c, &wire.InitAck{Capabilities: wire.GradientCapabilities{Core: true}, AuthorizedPeers: []string{}, FailedPeers: []wire.FailedPeer{}}, ver)
}

// Against a server of newer protocol versions only, the worker closes
// with 1002 and the refusal, not 1000.
func TestWorkerRefusesIncompatibleServerWithCloseFrame(t *testing.T) {
	t.Parallel()
	seen := make(chan closeSeen, 8)
	url := bareServer(t, func(c *websocket.Conn) {
		if _, _, err := c.ReadMessage(); err != nil {
			return
		}
		c.WriteMessage(websocket.BinaryMessage, wire.VersionFrame(wire.VersionRange{Oldest: 34, Newest: 35}))
		frame, err := closeFrame(c)
		seen <- closeSeen{frame, err}
	})
	startWorker(t, testConfig(t, url, nil))
	wantClose(t, seen, session.CloseProtocolError,
		fmt.Sprintf("no shared protocol version: ours %d..=%d, peer 34..=35", wire.Supported.Oldest, wire.Supported.Newest))
}

// A server dialing the worker's listener with newer versions only gets
// 1002 and the refusal too.
func TestListenerRefusesIncompatibleServerWithCloseFrame(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "", newBlockingExecutor())
	cfg.Session.Listener, cfg.Session.InsecureListen = ln, true
	startWorker(t, cfg)
	c, _, err := websocket.DefaultDialer.DialContext(t.Context(), "ws://"+ln.Addr().String()+"/proto", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteMessage(websocket.BinaryMessage, wire.VersionFrame(wire.VersionRange{Oldest: 34, Newest: 35})); err != nil {
		t.Fatal(err)
	}
	seen := make(chan closeSeen, 1)
	frame, err := closeFrame(c)
	seen <- closeSeen{frame, err}
	wantClose(t, seen, session.CloseProtocolError,
		fmt.Sprintf("no shared protocol version: ours %d..=%d, peer 34..=35", wire.Supported.Oldest, wire.Supported.Newest))
}

// A stopping worker (SIGTERM) closes its session with a close frame, and
// a handshake it is in the middle of with 1001: the server never sees the
// socket just drop.
func TestWorkerStopSendsCloseFrame(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		established bool
		code        int
		reason      string
	}{
		{"established", true, session.CloseNormal, "worker stopping"},
		{"handshaking", false, session.CloseGoingAway, "going away"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ready := make(chan struct{}, 1)
			seen := make(chan closeSeen, 8)
			url := bareServer(t, func(c *websocket.Conn) {
				if tc.established {
					err := bareAuthority(c)
					if err == nil {
						_, _, err = c.ReadMessage() // the session's first message: the worker is past the handshake
					}
					if err != nil {
						seen <- closeSeen{err: err}
						return
					}
				} else if _, _, err := c.ReadMessage(); err != nil { // the version frame, then silence
					seen <- closeSeen{err: err}
					return
				}
				ready <- struct{}{}
				frame, err := closeFrame(c)
				seen <- closeSeen{frame, err}
			})
			_, stop := startWorker(t, testConfig(t, url, nil))
			recvChan(t, "the worker connected", ready)
			stop()
			wantClose(t, seen, tc.code, tc.reason)
		})
	}
}

// A worker whose socket died half-open (a proxy that stops forwarding)
// notices by its ack timeout and reconnects: the server answers 496 while
// the old session holds the ID, but probes that session at once and drops
// it, so the worker is back long before the 120 s heartbeat would have
// freed the ID.
func TestWorkerReconnectsPastAHalfOpenSession(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		r := newRealServer(t, db, server.Config{})
		proxy := halfopen.New(t, r.addr)
		cfg := testConfig(t, "ws://"+proxy.Addr()+"/proto", newBlockingExecutor())
		cfg.Session.Peers = r.project.ID + ":" + r.register(r.project.ID, cfg.Session.WorkerID)
		cfg.Session.AckTimeout = time.Second
		var logs *testlog.Buffer
		cfg.Session.Logger, logs = testlog.New(t, "worker")
		startWorker(t, cfg)
		waitfor.True(t, "the worker live", func() bool { return r.srv.WorkerStatus(cfg.Session.WorkerID).Live })
		first := r.srv.WorkerStatus(cfg.Session.WorkerID).ConnectedAt

		proxy.Freeze()
		waitfor.Within(t, 60*time.Second, "the worker live on a new connection", func() bool {
			st := r.srv.WorkerStatus(cfg.Session.WorkerID)
			return st.Live && st.ConnectedAt.After(first)
		})
		if !strings.Contains(logs.String(), "worker already connected") {
			t.Error("the reconnect was not refused with 496 first: the probe was not exercised")
		}
	})
}
