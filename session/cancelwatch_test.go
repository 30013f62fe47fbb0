package session

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The watch stays registered between operations: a context used for many
// reads still closes the connection with 1001 when it ends under a later
// one.
func TestCancelUnderALaterReadSendsCloseFrame(t *testing.T) {
	a, d := loopback(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	wctx := context.Background()
	for i := range 3 {
		if err := d.WriteMessage(wctx, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if m, err := a.ReadMessage(ctx); err != nil || len(m) != 1 || m[0] != byte(i) {
			t.Fatalf("read %d: %v %v", i, m, err)
		}
	}
	done := make(chan error, 1)
	go func() { _, err := a.ReadMessage(ctx); done <- err }()
	cancel(errors.New("server stopping"))
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	_, err := d.ReadMessage(rctx)
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != CloseGoingAway || ce.Reason != "server stopping" {
		t.Fatalf("got %v, want close 1001 %q", err, "server stopping")
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("the cancelled read returned %v", err)
	}
}

// A context that ends while no operation runs under it closes nothing: a
// writer cancels its own context when it ends cleanly, and the session's
// own close (1000 here) must be what the peer sees.
func TestContextEndingBetweenOperationsClosesNothing(t *testing.T) {
	a, d := loopback(t)
	wctx, wcancel := context.WithCancel(context.Background())
	rctx, rcancel := context.WithCancel(context.Background())
	if err := a.WriteMessage(wctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadMessage(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteMessage(context.Background(), []byte("y")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ReadMessage(rctx); err != nil {
		t.Fatal(err)
	}
	// Wait for both callbacks, so a close they wrongly started is seen.
	fired := make(chan struct{}, 2)
	ws := a.(*wsTransport)
	ws.reads.firedHook = func() { fired <- struct{}{} }
	ws.writes.firedHook = ws.reads.firedHook
	wcancel()
	rcancel()
	<-fired
	<-fired
	// The peer can still talk to a: its connection is open.
	if err := d.WriteMessage(context.Background(), []byte("z")); err != nil {
		t.Fatal(err)
	}
	if m, err := a.ReadMessage(context.Background()); err != nil || string(m) != "z" {
		t.Fatalf("after the contexts ended: %q %v", m, err)
	}
	go a.Close(CloseNormal, "bye")
	_, err := d.ReadMessage(context.Background())
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != CloseNormal || ce.Reason != "bye" {
		t.Fatalf("got %v, want close 1000 %q", err, "bye")
	}
}

// An operation under a context that already ended does not start: it
// fails as closed and the close frame names the cause.
func TestWriteUnderAnEndedContextCloses(t *testing.T) {
	a, d := loopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.WriteMessage(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := a.WriteMessage(ctx, []byte("y")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write under an ended context: %v", err)
	}
	if m, err := d.ReadMessage(context.Background()); err != nil || string(m) != "x" {
		t.Fatalf("first message: %q %v", m, err)
	}
	_, err := d.ReadMessage(context.Background())
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != CloseGoingAway {
		t.Fatalf("got %v, want close 1001", err)
	}
}

// BenchmarkSmallMessage: one small message written and read over a
// loopback WebSocket under cancellable contexts, as a session's reader
// and writer do; the allocations per message are the measure.
func BenchmarkSmallMessage(b *testing.B) {
	a, d := loopback(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msg := make([]byte, 100)
	b.ReportAllocs()
	for b.Loop() {
		if err := d.WriteMessage(ctx, msg); err != nil {
			b.Fatal(err)
		}
		if _, err := a.ReadMessage(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
