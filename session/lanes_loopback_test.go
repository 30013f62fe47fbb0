package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

// A control reply queued behind a saturated bulk lane goes out before the
// queued bulk chunks, and the chunks then follow in order, none dropped.
func TestControlOvertakesSaturatedBulkLane(t *testing.T) {
	ss, ws := establish(t, openPolicy(), nil, Options{SendTimeout: 100 * time.Millisecond}, Options{})
	sent := 0
	for {
		err := ss.Send(narPush(sent, 100<<10))
		if errors.Is(err, ErrStalled) {
			break // the worker reads nothing: the bulk lane is full
		}
		if err != nil {
			t.Fatal(err)
		}
		sent++
	}
	if err := ss.Send(&wire.CacheStatus{QueryID: "reply"}); err != nil {
		t.Fatalf("control reply: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bulkAfterReply, next := -1, 0
	for next < sent {
		m, err := ws.Reader.Recv(ctx)
		if err != nil {
			t.Fatalf("after %d chunks: %v", next, err)
		}
		switch v := m.(type) {
		case *wire.NarPush:
			if v.Offset != uint64(next) || len(v.Data) != 100<<10 || v.Data[0] != byte(next) {
				t.Fatalf("chunk %d out of order or damaged (offset %d)", next, v.Offset)
			}
			next++
			if bulkAfterReply >= 0 {
				bulkAfterReply++
			}
		case *wire.CacheStatus:
			bulkAfterReply = 0
		}
	}
	if bulkAfterReply < BulkLaneDepth {
		t.Fatalf("only %d of %d chunks followed the reply; the %d queued ones must", bulkAfterReply, sent, BulkLaneDepth)
	}
}

func TestMessagesRoundTripBothWays(t *testing.T) {
	ss, ws := establish(t, openPolicy(), nil, Options{}, Options{})
	ctx := context.Background()
	if ss.Version() != wire.NewestVersion || ws.Writer.Version() != wire.NewestVersion || ws.Reader.Version() != wire.NewestVersion {
		t.Fatal("versions")
	}
	if err := ws.Send(&wire.LogChunk{JobID: "j", Data: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	m, err := ss.Reader.Recv(ctx)
	if lc, ok := m.(*wire.LogChunk); err != nil || !ok || string(lc.Data) != "hello" {
		t.Fatalf("got %#v %v", m, err)
	}
	if err := ss.Send(&wire.ServerDraining{}); err != nil {
		t.Fatal(err)
	}
	if m, err := ws.Reader.Recv(ctx); err != nil || m.WireName() != "Draining" {
		t.Fatalf("got %#v %v", m, err)
	}
}

// Decoded payloads alias their own frame: a held message survives later
// reads, and a released buffer is reused only after Release.
func TestPayloadBuffersOwnedUntilReleased(t *testing.T) {
	ss, ws := establish(t, openPolicy(), nil, Options{}, Options{})
	ctx := context.Background()
	for i := range 4 {
		if err := ss.Send(narPush(i, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	first, err := ws.Reader.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := ws.Reader.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := first.(*wire.NarPush).Data
	if held[0] != 0 || held[len(held)-1] != 0 || second.(*wire.NarPush).Data[0] != 1 {
		t.Fatal("a held payload was overwritten by a later read")
	}
	ws.Reader.Release() // second's buffer may now be reused
	third, _ := ws.Reader.Recv(ctx)
	ws.Reader.Release()
	fourth, _ := ws.Reader.Recv(ctx)
	if third.(*wire.NarPush).Offset != 2 || fourth.(*wire.NarPush).Data[0] != 3 || held[0] != 0 {
		t.Fatal("released-buffer reads are wrong")
	}
}

func TestSessionEndsWhenPeerCloses(t *testing.T) {
	ss, ws := establish(t, openPolicy(), nil, Options{}, Options{})
	ws.Close(CloseNormal, "worker stopping")
	if _, err := ss.Recv(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v", err)
	}
	<-ss.Done()
	if err := ss.Send(&wire.ServerDraining{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after end: %v", err)
	}
	var ce *CloseError
	if _, err := ss.Reader.Recv(context.Background()); !errors.As(err, &ce) && !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v", err)
	}
}
