package downstream

import (
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
)

// A worker's login costs the proxy at most one argon2id check, however
// many tokens its AuthResponse names its own ID with: the first token
// for the ID counts (the server's rule: one token per challenged peer,
// duplicates: the first wins), the rest are refused unhashed. Before,
// each of them ran a check, so a few logins of hundreds of tokens kept
// the proxy's cores busy for minutes.
func TestALoginCostsAtMostOneTokenCheck(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		box, err := sealbox.New(sealbox.NewKey())
		if err != nil {
			t.Fatal(err)
		}
		store, err := proxystore.Open(t.Context(), dbURL, box)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		tenant, err := store.CreateTenant(t.Context(), "tenant-a")
		if err != nil {
			t.Fatal(err)
		}
		row, token := createWorker(t, store, tenant.ID, "a1", proxystore.Capabilities{Build: true})

		var checks atomic.Int64
		leg, err := New(Config{Store: store, Logger: slog.New(slog.DiscardHandler),
			ObserveTokenCheck: func(time.Duration, bool) { checks.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(leg.Authority().ProtoHandler())
		t.Cleanup(func() { leg.Close(); hs.Close() })
		url := "ws" + strings.TrimPrefix(hs.URL, "http")

		const flood = 400
		wrong := strings.Repeat("x", len(token))
		many := func(first, rest string) []wire.Pair[string, string] {
			tokens := []wire.Pair[string, string]{{First: row.ID, Second: first}}
			for range flood - 1 {
				tokens = append(tokens, wire.Pair[string, string]{First: row.ID, Second: rest})
			}
			return tokens
		}

		ran := func() int64 { return checks.Swap(0) }

		// The attack: every token wrong. One check, not one per token.
		answer := bareLogin(t, url, row.ID, many(wrong, wrong))
		if r, ok := answer.(*wire.ServerReject); !ok || r.Code != 401 {
			t.Fatalf("%d wrong tokens: answered %#v, want Reject 401", flood, answer)
		}
		if n := ran(); n != 1 {
			t.Fatalf("%d tokens for the worker's own ID ran %d argon2id checks, want 1", flood, n)
		}

		// The first token wrong, the right one among the rest: refused
		// (the first token for a peer is the one that counts).
		answer = bareLogin(t, url, row.ID, many(wrong, token))
		if r, ok := answer.(*wire.ServerReject); !ok || r.Code != 401 {
			t.Fatalf("%d tokens, the first wrong: answered %#v, want Reject 401", flood, answer)
		}
		if n := ran(); n != 1 {
			t.Fatalf("%d tokens, the first wrong, ran %d argon2id checks, want 1", flood, n)
		}

		// Tokens for peers the proxy never challenged cost nothing.
		var others []wire.Pair[string, string]
		for i := range flood {
			others = append(others, wire.Pair[string, string]{First: strings.Repeat(string(rune('a'+i%26)), 8), Second: token})
		}
		answer = bareLogin(t, url, row.ID, others)
		if r, ok := answer.(*wire.ServerReject); !ok || r.Code != 401 {
			t.Fatalf("tokens for other peers only: answered %#v, want Reject 401", answer)
		}
		if n := ran(); n != 0 {
			t.Fatalf("tokens for unchallenged peers ran %d argon2id checks, want none", n)
		}

		// The right token first: admitted, with one more check.
		answer = bareLogin(t, url, row.ID, many(token, wrong))
		if _, ok := answer.(*wire.InitAck); !ok {
			t.Fatalf("the right token first: answered %#v, want InitAck", answer)
		}
		if n := ran(); n != 1 {
			t.Fatalf("admitting with the right token first ran %d argon2id checks, want 1", n)
		}
	})
}

// bareLogin runs a worker's handshake by hand (a bare WebSocket speaking
// the wire format, not our session code) with the given AuthResponse,
// and returns the proxy's answer to it; the connection is closed after.
func bareLogin(t *testing.T, url, workerID string, tokens []wire.Pair[string, string]) wire.ServerMessage {
	t.Helper()
	c, _, err := websocket.DefaultDialer.DialContext(t.Context(), url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	defer c.Close()
	send := func(b []byte) {
		t.Helper()
		if err := c.WriteMessage(websocket.BinaryMessage, b); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	read := func() []byte {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(time.Minute))
		_, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return b
	}
	send(wire.VersionFrame(wire.Supported))
	ver, err := wire.Agree(wire.Supported, read())
	if err != nil {
		t.Fatal(err)
	}
	sendMsg := func(m wire.ClientMessage) {
		t.Helper()
		b, err := wire.AppendClientMessage(nil, m, ver)
		if err != nil {
			t.Fatal(err)
		}
		send(b)
	}
	recv := func() wire.ServerMessage {
		t.Helper()
		m, err := wire.DecodeServerMessage(read(), ver)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	sendMsg(&wire.InitConnection{Capabilities: wire.GradientCapabilities{Build: true}, ID: workerID})
	if ch, ok := recv().(*wire.AuthChallenge); !ok || len(ch.Peers) != 1 || ch.Peers[0] != workerID {
		t.Fatalf("challenge %#v, want the worker's own ID alone", ch)
	}
	sendMsg(&wire.AuthResponse{Tokens: tokens})
	return recv()
}
