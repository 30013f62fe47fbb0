package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"

	"github.com/gorilla/websocket"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/halfopen"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// The close codes tests use a client that is not ours: a bare gorilla
// connection that speaks the wire format by hand, so what it reads is
// exactly what the server put on the socket.

func bareDial(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.DefaultDialer.DialContext(t.Context(), url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func bareSend(t *testing.T, c *websocket.Conn, frame []byte) {
	t.Helper()
	if err := c.WriteMessage(websocket.BinaryMessage, frame); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// bareAgree sends our version frame and reads the server's.
func bareAgree(t *testing.T, c *websocket.Conn) uint16 {
	t.Helper()
	bareSend(t, c, wire.VersionFrame(wire.Supported))
	frame := bareRead(t, c)
	ver, err := wire.Agree(wire.Supported, frame)
	if err != nil {
		t.Fatalf("agree: %v", err)
	}
	return ver
}

func bareRead(t *testing.T, c *websocket.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, b, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return b
}

func bareSendClient(t *testing.T, c *websocket.Conn, ver uint16, m wire.ClientMessage) {
	t.Helper()
	b, err := wire.AppendClientMessage(nil, m, ver)
	if err != nil {
		t.Fatal(err)
	}
	bareSend(t, c, b)
}

func bareRecvServer(t *testing.T, c *websocket.Conn, ver uint16) wire.ServerMessage {
	t.Helper()
	m, err := wire.DecodeServerMessage(bareRead(t, c), ver)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// bareHandshake runs the worker's handshake by hand and returns the
// established connection at the agreed version.
func bareHandshake(t *testing.T, c *websocket.Conn, workerID string, tokens map[string]string) uint16 {
	t.Helper()
	ver := bareAgree(t, c)
	bareSendClient(t, c, ver, &wire.InitConnection{Capabilities: servertest.WorkerCaps, ID: workerID})
	ch, ok := bareRecvServer(t, c, ver).(*wire.AuthChallenge)
	if !ok {
		t.Fatal("no AuthChallenge")
	}
	var answer []wire.Pair[string, string]
	for _, p := range ch.Peers {
		if tok, ok := tokens[p]; ok {
			answer = append(answer, wire.Pair[string, string]{First: p, Second: tok})
		}
	}
	bareSendClient(t, c, ver, &wire.AuthResponse{Tokens: answer})
	if m, ok := bareRecvServer(t, c, ver).(*wire.InitAck); !ok {
		t.Fatalf("got %s, want InitAck", m.WireName())
	}
	return ver
}

// bareCloseFrame reads until the connection ends and returns the close
// frame the server sent; a connection that ends without one (1006) fails.
func bareCloseFrame(t *testing.T, c *websocket.Conn) *websocket.CloseError {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code == websocket.CloseAbnormalClosure {
			t.Fatalf("the connection ended without a close frame: %v", err)
		}
		return ce
	}
}

func expectClose(t *testing.T, c *websocket.Conn, code int, reason string) {
	t.Helper()
	ce := bareCloseFrame(t, c)
	if ce.Code != code || ce.Text != reason {
		t.Fatalf("close frame %d %q, want %d %q", ce.Code, ce.Text, code, reason)
	}
}

// Every refusal before the handshake reaches the peer with its code and
// reason, on worker and cache sessions alike: no handler's cleanup may
// replace them with 1000.
func TestRefusalsReachAForeignClient(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{})
		cacheURL := strings.TrimSuffix(e.URL, "/proto") + "/cache/" + e.Cache.Name + "/proto"
		if err := db.SetCachePublic(t.Context(), e.Cache.ID, true); err != nil {
			t.Fatal(err)
		}
		noShared := fmt.Sprintf("no shared protocol version: ours %d..=%d, peer 34..=35", wire.Supported.Oldest, wire.Supported.Newest)
		older := fmt.Sprintf("peer protocol is older than %d", wire.Supported.Oldest)
		big := bytes.Repeat([]byte{0}, session.MaxHandshakeMessageSize+1)
		tooLarge := fmt.Sprintf("a handshake message is limited to %d bytes, got %d", session.MaxHandshakeMessageSize, len(big))
		for _, url := range []string{e.URL, cacheURL} {
			c := bareDial(t, url)
			bareSend(t, c, wire.VersionFrame(wire.VersionRange{Oldest: 34, Newest: 35}))
			expectClose(t, c, session.CloseProtocolError, noShared)

			c = bareDial(t, url)
			bareSend(t, c, []byte("\x00\x01rkyv-greeting"))
			expectClose(t, c, session.CloseProtocolError, older)

			c = bareDial(t, url)
			bareAgree(t, c)
			bareSend(t, c, big)
			expectClose(t, c, session.CloseProtocolError, tooLarge)
		}
	})
}

// Server Stop (SIGTERM) closes established sessions with 1001 and a
// handshaking one with 1001 too, never by dropping the socket.
func TestStopClosesWithGoingAway(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		tokens := map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)}
		live := bareDial(t, e.URL)
		bareHandshake(t, live, id, tokens)
		waitfor.True(t, "the worker live", func() bool { return e.Srv.WorkerStatus(id).Live })
		handshaking := bareDial(t, e.URL)
		bareAgree(t, handshaking)

		e.Srv.Close()
		expectClose(t, live, session.CloseGoingAway, "server stopping")
		expectClose(t, handshaking, session.CloseGoingAway, "server stopping")
	})
}

// splitSession waits until the worker's session is past its handshake
// (probes skip a session still in it) and returns it.
func splitSession(e *servertest.Env, workerID string) *authority.LiveWorker {
	e.T.Helper()
	var c *authority.LiveWorker
	waitfor.True(e.T.(*testing.T), "the session of "+workerID, func() bool {
		c = e.Srv.LiveSession(workerID)
		return c != nil
	})
	return c
}

// A worker whose old socket died half-open is refused with 496 once, and
// the old session is probed and dropped, so the next attempt succeeds
// long before the 120 s heartbeat; a healthy old session survives the
// probe.
func TestSecondConnectionProbesTheOldSession(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{HandshakeTimeout: 15 * time.Second})
		proxy := halfopen.New(t, strings.TrimSuffix(strings.TrimPrefix(e.URL, "ws://"), "/proto"))

		healthy := storage.NewID()
		tokens := map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, healthy)}
		w := e.MustConnect(healthy, tokens)
		go func() {
			for {
				if _, err := w.Sess.Recv(context.Background()); err != nil {
					return
				}
			}
		}()
		first := splitSession(e, healthy)
		e.ExpectReject(healthy, tokens, 496, "worker already connected")
		if e.Srv.LiveSession(healthy) != first || strings.Contains(e.Logs.String(), "no answer to a ping") {
			t.Fatal("a healthy session was dropped by the probe")
		}

		id := storage.NewID()
		tokens = map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)}
		old := bareDial(t, "ws://"+proxy.Addr()+"/proto")
		bareHandshake(t, old, id, tokens)
		oldConn := splitSession(e, id)
		proxy.Freeze()

		fresh := bareDial(t, e.URL)
		ver := bareAgree(t, fresh)
		bareSendClient(t, fresh, ver, &wire.InitConnection{Capabilities: servertest.WorkerCaps, ID: id})
		bareRecvServer(t, fresh, ver) // AuthChallenge
		bareSendClient(t, fresh, ver, &wire.AuthResponse{Tokens: []wire.Pair[string, string]{{First: e.Project.ID, Second: tokens[e.Project.ID]}}})
		if m, ok := bareRecvServer(t, fresh, ver).(*wire.ServerReject); !ok || m.Code != 496 {
			t.Fatalf("second connection: got %+v, want Reject 496", m)
		}
		// The heartbeat would take 120 s; the probe has dropped the old
		// session by the time the worker tries again.
		if c := e.Srv.LiveSession(id); c == oldConn {
			t.Fatal("the half-open session still holds the worker ID after the 496")
		}
		if !strings.Contains(e.Logs.String(), "no answer to a ping") {
			t.Error("the drop of the half-open session was not logged")
		}
		again := bareDial(t, e.URL)
		bareHandshake(t, again, id, tokens)
		waitfor.True(t, "the reconnected worker live", func() bool { return e.Srv.WorkerStatus(id).Live })
	})
}

// A worker the server dials that speaks only newer versions gets 1002 and
// the refusal from the server's dial, too.
func TestDialRefusalReachesAForeignWorker(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, dialConfig(t))
		closes := make(chan *websocket.CloseError, 64)
		up := websocket.Upgrader{}
		worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer c.Close()
			if _, _, err := c.ReadMessage(); err != nil { // the server's version frame
				return
			}
			c.WriteMessage(websocket.BinaryMessage, wire.VersionFrame(wire.VersionRange{Oldest: 34, Newest: 35}))
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				if _, _, err := c.ReadMessage(); err != nil {
					var ce *websocket.CloseError
					errors.As(err, &ce)
					closes <- ce
					return
				}
			}
		}))
		t.Cleanup(worker.Close)
		settings := storage.DefaultWorkerSettings()
		settings.URL = "ws" + strings.TrimPrefix(worker.URL, "http") + "/proto"
		if _, _, err := e.Srv.CreateRegistration(t.Context(), storage.Peer{Kind: storage.PeerProject, ID: e.Project.ID}, storage.NewID(), settings); err != nil {
			t.Fatal(err)
		}
		var ce *websocket.CloseError
		select {
		case ce = <-closes:
		case <-time.After(20 * time.Second):
			t.Fatal("the server never dialed")
		}
		want := fmt.Sprintf("no shared protocol version: ours %d..=%d, peer 34..=35", wire.Supported.Oldest, wire.Supported.Newest)
		if ce == nil || ce.Code != session.CloseProtocolError || ce.Text != want {
			t.Fatalf("close frame %v, want 1002 %q", ce, want)
		}
	})
}
