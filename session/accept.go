package session

import (
	"net/http"

	"github.com/gorilla/websocket"
)

// upgrader accepts protocol WebSockets. The read buffer is the one the HTTP
// server already allocated for the request (ReadBufferSize 0 reuses it);
// write buffers come from a shared pool, held only while writing.
var upgrader = &websocket.Upgrader{
	WriteBufferSize:   serverWriteBufferSize,
	WriteBufferPool:   &serverWritePool,
	EnableCompression: false,
	// Workers are not browsers: they send no Origin header, and the
	// protocol authenticates itself in the handshake.
	CheckOrigin: func(*http.Request) bool { return true },
}

// Accept upgrades an HTTP request to a protocol WebSocket with the same
// settings a dial uses (8 MiB cap, no compression). On error the response
// has been written already.
func Accept(w http.ResponseWriter, r *http.Request) (Transport, error) {
	c, err := upgrader.Upgrade(&hijackCoalescing{ResponseWriter: w}, r, nil)
	if err != nil {
		return nil, err
	}
	return NewWebSocketTransport(c), nil
}

// Handler serves protocol WebSockets: every upgraded request runs serve on
// its own goroutine (the request's), and the socket is closed when serve
// returns. Mount it on a path (/proto, /cache/{cache}/proto, a worker's
// listener).
func Handler(serve func(r *http.Request, t Transport)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, err := Accept(w, r)
		if err != nil {
			return
		}
		defer t.Close(CloseNormal, "")
		serve(r, t)
	})
}
