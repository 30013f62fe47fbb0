package session

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

// readAll keeps a session's reader running (WebSocket pongs and close
// frames are processed while reading) and reports how it ended.
func readAll[In, Out wire.Message](s *Session[In, Out]) <-chan error {
	ch := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Reader.Recv(context.Background()); err != nil {
				ch <- err
				return
			}
		}
	}()
	return ch
}

func TestHeartbeatDropsSilentWorker(t *testing.T) {
	ss, ws := establish(t, openPolicy(), nil, Options{HeartbeatTimeout: 100 * time.Millisecond}, Options{})
	ended := readAll(ws)
	select {
	case <-ss.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("silent session kept")
	}
	if !strings.Contains(ss.Reason(), "heartbeat timeout") {
		t.Fatalf("reason %q", ss.Reason())
	}
	var ce *CloseError
	if err := <-ended; !errors.As(err, &ce) || ce.Code != ClosePolicy {
		t.Fatalf("worker saw %v", err)
	}
}

func TestHeartbeatKeepsTalkingWorker(t *testing.T) {
	ss, ws := establish(t, openPolicy(), nil, Options{HeartbeatTimeout: 500 * time.Millisecond}, Options{})
	go readAll(ss)
	for range 50 {
		if err := ws.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-ss.Done():
		t.Fatalf("talking session dropped: %s", ss.Reason())
	default:
	}
}

func TestAckTimeoutDropsUnresponsiveServer(t *testing.T) {
	// The server never reads, so it never answers the worker's pings.
	_, ws := establish(t, openPolicy(), nil, Options{}, Options{AckTimeout: 150 * time.Millisecond, PingInterval: 10 * time.Millisecond})
	go readAll(ws)
	ws.Send(&wire.RequestJobList{})
	select {
	case <-ws.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("unacknowledged session kept")
	}
	if !strings.Contains(ws.Reason(), "unacknowledged") {
		t.Fatalf("reason %q", ws.Reason())
	}
}

func TestAckTimeoutKeepsAnsweringServer(t *testing.T) {
	ss, ws := establish(t, openPolicy(), nil, Options{}, Options{AckTimeout: 2 * time.Second, PingInterval: 10 * time.Millisecond})
	go readAll(ss)
	go readAll(ws)
	time.Sleep(300 * time.Millisecond) // about 30 ping round trips
	select {
	case <-ws.Done():
		t.Fatalf("acknowledged session dropped: %s", ws.Reason())
	default:
	}
}
