package hub

import (
	"sync/atomic"
	"testing"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/wire"
)

// A worker that stops reading is cut off once its queue overflows; the
// sender never blocks and another worker's queue keeps flowing.
func TestOutboxCutsOffASlowWorker(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var cut atomic.Value
	slow := NewOutbox(func(wire.ServerMessage) error { <-release; return nil }, func(reason string) { cut.Store(reason) })
	defer slow.Close()
	fastGot := make(chan struct{})
	fast := NewOutbox(func(wire.ServerMessage) error { fastGot <- struct{}{}; return nil }, func(string) { t.Error("the fast worker was cut off") })
	defer fast.Close()

	chunk := make([]byte, 512<<10)
	for i := range 2 * OutboxBytes / len(chunk) {
		m := &wire.NarPush{JobID: "j", StorePath: "/nix/store/x", Data: chunk, Offset: uint64(i * len(chunk))}
		slow.Send(m) // returns at once, also once cut off
		fast.Send(m)
		<-fastGot // the fast worker reads each chunk
	}
	waitfor.True(t, "the slow worker cut off", func() bool { return cut.Load() != nil })
}

// Messages leave in order.
func TestOutboxKeepsOrder(t *testing.T) {
	got := make(chan uint64, 100)
	o := NewOutbox(func(m wire.ServerMessage) error { got <- m.(*wire.NarPush).Offset; return nil }, func(string) {})
	defer o.Close()
	for i := range 100 {
		o.Send(&wire.NarPush{Offset: uint64(i)})
	}
	for i := range 100 {
		if off := <-got; off != uint64(i) {
			t.Fatalf("message %d left as %d", i, off)
		}
	}
}

// Finish closes after what was queued before it; later sends are dropped.
func TestOutboxFinishesAfterTheQueue(t *testing.T) {
	got := make(chan string, 10)
	o := NewOutbox(func(m wire.ServerMessage) error { got <- m.WireName(); return nil }, func(string) {})
	o.Send(&wire.AbortJob{})
	o.Send(&wire.ServerDraining{})
	o.Finish(func() { got <- "close" })
	o.Send(&wire.JobOffer{})
	for _, want := range []string{"AbortJob", "Draining", "close"} {
		if m := <-got; m != want {
			t.Fatalf("got %s, want %s", m, want)
		}
	}
	select {
	case m := <-got:
		t.Fatalf("%s went out after Finish", m)
	default:
	}
}

// Backlog counts the queued bytes; WhenDrained fires once the session
// took enough of them, and at once when the queue is short already.
func TestOutboxReportsItsBacklogAndDrain(t *testing.T) {
	release := make(chan struct{})
	o := NewOutbox(func(wire.ServerMessage) error { <-release; return nil }, func(string) { t.Error("cut off") })
	defer o.Close()
	chunk := make([]byte, 1<<20)
	for range 5 {
		o.Send(&wire.NarPush{Data: chunk})
	}
	// One message is with the session, the others wait.
	waitfor.True(t, "four messages queued", func() bool { return o.Backlog() == 4*messageSize(&wire.NarPush{Data: chunk}) })
	drained := make(chan struct{})
	o.WhenDrained(2<<20, func() { close(drained) })
	select {
	case <-drained:
		t.Fatal("drained with 4 MiB queued")
	default:
	}
	for range 3 {
		release <- struct{}{}
	}
	<-drained // below 2 MiB once the third message left the queue
	now := make(chan struct{})
	o.WhenDrained(2<<20, func() { close(now) })
	<-now
	close(release)
}
