package session

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// Text messages (and pings, answered inside the library) never reach the
// protocol: the next binary message does.
func TestNonBinaryMessagesSkipped(t *testing.T) {
	got := make(chan []byte, 1)
	srv := httptest.NewServer(Handler(func(r *http.Request, tr Transport) {
		m, err := tr.ReadMessage(r.Context())
		if err != nil {
			t.Error(err)
		}
		got <- m
	}))
	defer srv.Close()
	ctx := context.Background()
	c, _, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.WriteMessage(websocket.TextMessage, []byte("not protocol"))
	c.WriteControl(websocket.PingMessage, []byte("p"), time.Now().Add(time.Second)) // answered by the accepted end while it reads
	c.WriteMessage(websocket.PongMessage, nil)                                      // unsolicited pong: ignored
	c.WriteMessage(websocket.BinaryMessage, []byte("GRAD"))
	if m := <-got; string(m) != "GRAD" {
		t.Fatalf("got %q", m)
	}
}
