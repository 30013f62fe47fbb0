package session

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A handler's deferred Close(1000) after a refusal must not replace the
// refusal's 1002 and reason: the first close decides.
func TestLaterCloseKeepsTheFirstCode(t *testing.T) {
	a, d := loopback(t)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := NewConn(a, quiet()).RecvClient(ctx)
		a.Close(CloseNormal, "") // what every handler defers
		done <- err
	}()
	if err := d.WriteMessage(ctx, append([]byte{0, 1}, "rkyv-greeting"...)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadMessage(ctx); err != nil { // the version frame
		t.Fatal(err)
	}
	_, err := d.ReadMessage(ctx)
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != CloseProtocolError || ce.Reason != "peer protocol is older than 30" {
		t.Fatalf("got %v, want close 1002 %q", err, "peer protocol is older than 30")
	}
	if err := <-done; err == nil {
		t.Fatal("receive yielded a message")
	}
}

// A read cut short by its context closes with a close frame, not by
// dropping the socket: 1001 with the cancel cause when cancelled, 1008 on
// a deadline.
func TestCancelledReadSendsCloseFrame(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ctx    func() (context.Context, func())
		code   int
		reason string
	}{
		{"cancelled with a cause", func() (context.Context, func()) {
			ctx, cancel := context.WithCancelCause(context.Background())
			return ctx, func() { cancel(errors.New("server stopping")) }
		}, CloseGoingAway, "server stopping"},
		{"cancelled", func() (context.Context, func()) {
			ctx, cancel := context.WithCancel(context.Background())
			return ctx, cancel
		}, CloseGoingAway, "going away"},
		{"deadline", func() (context.Context, func()) {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			return ctx, func() { <-ctx.Done(); cancel() }
		}, ClosePolicy, "timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, d := loopback(t)
			ctx, end := tc.ctx()
			done := make(chan error, 1)
			go func() { _, err := a.ReadMessage(ctx); done <- err }()
			end()
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := d.ReadMessage(rctx)
			var ce *CloseError
			if !errors.As(err, &ce) || ce.Code != tc.code || ce.Reason != tc.reason {
				t.Fatalf("got %v, want close %d %q", err, tc.code, tc.reason)
			}
			if err := <-done; !errors.Is(err, ErrClosed) {
				t.Fatalf("the cancelled read returned %v", err)
			}
		})
	}
}
