package session

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
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
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.Write(ctx, websocket.MessageText, []byte("not protocol"))
	go c.Ping(ctx) // answered by the accepted end while it reads
	c.Write(ctx, websocket.MessageBinary, []byte("GRAD"))
	if m := <-got; string(m) != "GRAD" {
		t.Fatalf("got %q", m)
	}
}
