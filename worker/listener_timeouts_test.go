package worker

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"gradient.dev/gradient/internal/httpguard"
)

// The --discoverable listener closes a connection whose headers stop
// half-way (the header timeout set short through the worker's Config),
// and a POST whose announced body never comes.
func TestDiscoverableListenerClosesStalledRequests(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "", newBlockingExecutor())
	cfg.Session.Listener = ln
	cfg.Session.InsecureListen = true
	cfg.Session.ListenTimeouts = httpguard.Timeouts{Header: 50 * time.Millisecond, Body: 50 * time.Millisecond, Idle: time.Hour}
	startWorker(t, cfg)

	for _, stalled := range []string{
		"GET /proto HTTP/1.1\r\nHost: worker\r\n",
		"POST /proto HTTP/1.1\r\nHost: worker\r\nContent-Length: 100\r\n\r\npart",
	} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, stalled); err != nil {
			t.Fatal(err)
		}
		// A bound far beyond the configured timeouts, only so that a
		// broken listener fails the test instead of hanging it.
		c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		_, err = io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%q: the listener kept the connection open", stalled)
		}
	}
}
