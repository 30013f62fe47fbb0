package session

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/wire"
)

func fill(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = bytes.Repeat([]byte{byte(i)}, size)
	}
	return out
}

func TestBatchesControlFirstAndBulkBytes(t *testing.T) {
	q := newQueues()
	for _, m := range fill(8, 100<<10) {
		q.bulk <- m
	}
	q.control <- []byte("ctl")
	stop := make(chan struct{})
	var buf [][]byte
	batch, lane := q.next(buf, stop, nil)
	if lane != ControlLane || len(batch) != 1 || string(batch[0]) != "ctl" {
		t.Fatalf("first batch: %v × %d", lane, len(batch))
	}
	batch, lane = q.next(batch, stop, nil)
	if lane != BulkLane || len(batch) != 3 || batch[0][0] != 0 || batch[2][0] != 2 {
		t.Fatalf("second batch: %v × %d", lane, len(batch))
	}
	q.control <- []byte("ctl2")
	batch, lane = q.next(batch, stop, nil)
	if lane != ControlLane || len(batch) != 1 || string(batch[0]) != "ctl2" {
		t.Fatalf("third batch: %v × %d", lane, len(batch))
	}
	for _, want := range []int{3, 2} {
		batch, lane = q.next(batch, stop, nil)
		if lane != BulkLane || len(batch) != want {
			t.Fatalf("bulk batch %d, want %d", len(batch), want)
		}
	}
	close(stop)
	if batch, _ = q.next(batch, stop, nil); len(batch) != 0 {
		t.Fatal("a batch after stop with empty lanes")
	}
}

func TestBulkBatchHoldsOneLargeChunk(t *testing.T) {
	q := newQueues()
	for _, m := range fill(2, BulkChunkSize) {
		q.bulk <- m
	}
	batch, _ := q.next(nil, nil, nil)
	if len(batch) != 1 {
		t.Fatalf("batch of %d", len(batch))
	}
	if BulkBatchBytes > BulkChunkSize || MaxProtoMessageSize < 2*BulkChunkSize || MaxProtoMessageSize > 16<<20 {
		t.Fatal("size constants out of their bounds")
	}
}

func TestControlBatchAtMost32(t *testing.T) {
	q := newQueues()
	for range 40 {
		q.control <- []byte("c")
	}
	batch, _ := q.next(nil, nil, nil)
	if len(batch) != WriteBatch {
		t.Fatalf("batch of %d", len(batch))
	}
}

func TestLaneMembership(t *testing.T) {
	bulkClient := []wire.ClientMessage{&wire.UploadChunk{}, &wire.LogChunk{}, &wire.NarRequestResume{}, &wire.JobCompleted{}, &wire.JobFailed{}}
	controlClient := []wire.ClientMessage{&wire.UploadRequest{}, &wire.UploadCancel{}, &wire.UploadFinished{}, &wire.InitConnection{}, &wire.CacheQuery{}}
	bulkServer := []wire.ServerMessage{&wire.NarPush{}, &wire.NarStreamHeader{}, &wire.NarUnavailable{}, &wire.NarAbort{}, &wire.EvalCachePullResult{}, &wire.EvalCacheChunk{}}
	controlServer := []wire.ServerMessage{&wire.CacheStatus{}, &wire.CacheError{}, &wire.UploadGrant{}, &wire.AssignJob{}}
	for _, m := range bulkClient {
		if ClientLane(m) != BulkLane {
			t.Errorf("%s not bulk", m.WireName())
		}
	}
	for _, m := range controlClient {
		if ClientLane(m) != ControlLane {
			t.Errorf("%s not control", m.WireName())
		}
	}
	for _, m := range bulkServer {
		if ServerLane(m) != BulkLane {
			t.Errorf("%s not bulk", m.WireName())
		}
	}
	for _, m := range controlServer {
		if ServerLane(m) != ControlLane {
			t.Errorf("%s not control", m.WireName())
		}
	}
}

// gated is a transport whose writes wait for the gate to open, recording
// what was written; reads never return.
type gated struct {
	open    chan struct{}
	mu      sync.Mutex
	written [][]byte
}

func newGated() *gated { return &gated{open: make(chan struct{})} }

func (g *gated) ReadMessage(ctx context.Context) ([]byte, error) {
	<-ctx.Done()
	return nil, ErrClosed
}

func (g *gated) WriteMessage(ctx context.Context, p []byte) error {
	select {
	case <-g.open:
	case <-ctx.Done():
		return ErrClosed
	}
	g.mu.Lock()
	g.written = append(g.written, append([]byte(nil), p...))
	g.mu.Unlock()
	return nil
}

func (g *gated) Close(int, string) error { return nil }

func (g *gated) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.written)
}

func narPush(i int, size int) *wire.NarPush {
	return &wire.NarPush{JobID: "j", StorePath: "/nix/store/x", Data: bytes.Repeat([]byte{byte(i)}, size), Offset: uint64(i)}
}

func TestSendStallsOnFullLane(t *testing.T) {
	g := newGated()
	w := NewWriter(g, wire.NewestVersion, ServerCodec, 20*time.Millisecond, discardLogger())
	defer w.Abort()
	// The task takes a first batch and blocks writing it; then 16 more fit.
	if err := w.Send(narPush(0, 10)); err != nil {
		t.Fatal(err)
	}
	for i := 1; ; i++ {
		err := w.Send(narPush(i, 10))
		if errors.Is(err, ErrStalled) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i > WriteBatch+BulkLaneDepth+1 {
			t.Fatalf("%d sends without stalling", i)
		}
	}
	if w.Stalls(BulkLane) != 1 || w.Queued(BulkLane) != BulkLaneDepth {
		t.Fatalf("stalls %d, queued %d", w.Stalls(BulkLane), w.Queued(BulkLane))
	}
	// A full bulk lane does not block control.
	if err := w.Send(&wire.CacheStatus{QueryID: "q"}); err != nil {
		t.Fatalf("control send: %v", err)
	}
}

func TestWriterDrainsAfterClose(t *testing.T) {
	g := newGated()
	w := NewWriter(g, wire.NewestVersion, ServerCodec, time.Second, discardLogger())
	for i := range 5 {
		if err := w.Send(narPush(i, 10)); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	if err := w.Send(narPush(9, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	close(g.open)
	<-w.Done()
	if w.Err() != nil || g.count() != 5 {
		t.Fatalf("err %v, wrote %d", w.Err(), g.count())
	}
	for i, b := range g.written {
		m, err := wire.DecodeServerMessage(b, wire.NewestVersion)
		if err != nil || m.(*wire.NarPush).Offset != uint64(i) {
			t.Fatalf("message %d: %v", i, err)
		}
	}

	idle := NewWriter(newGated(), wire.NewestVersion, ServerCodec, time.Second, nil)
	idle.Close()
	<-idle.Done()
	if idle.Err() != nil {
		t.Fatal(idle.Err())
	}
}

func TestSendEncodeFailure(t *testing.T) {
	w := NewWriter(newGated(), 31, ClientCodec, time.Second, discardLogger())
	defer w.Abort()
	err := w.Send(&wire.ImportRequest{JobID: "j"})
	var ee *EncodeError
	var newer *wire.NewerThanPeerError
	if !errors.As(err, &ee) || !errors.As(err, &newer) || newer.Since != 32 {
		t.Fatalf("got %v", err)
	}
	if w.Version() != 31 {
		t.Fatal("version")
	}
}

func TestSendRefusesOversizedMessage(t *testing.T) {
	w := NewWriter(newGated(), wire.NewestVersion, ClientCodec, time.Second, discardLogger())
	defer w.Abort()
	err := w.Send(&wire.LogChunk{JobID: "j", Data: make([]byte, MaxProtoMessageSize)})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v", err)
	}
}

// Offer never waits: it takes a frame while its lane has room, hands it
// back (false) once the lane is full, and the frames offered go out in
// order once the transport takes them.
func TestOfferNeverWaits(t *testing.T) {
	g := newGated()
	w := NewWriter(g, wire.NewestVersion, ServerCodec, time.Minute, discardLogger())
	defer w.Abort()
	offered := 0
	for {
		f, err := w.Encode(narPush(offered, 10))
		if err != nil {
			t.Fatal(err)
		}
		ok, err := w.Offer(f)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		offered++
		if offered > WriteBatch+BulkLaneDepth+1 {
			t.Fatalf("%d offers taken by a lane of %d", offered, BulkLaneDepth)
		}
	}
	if offered < BulkLaneDepth {
		t.Fatalf("only %d offers taken", offered)
	}
	close(g.open)
	waitfor.True(t, "the offered frames written", func() bool { return g.count() == offered })
	for i, b := range g.written {
		m, err := wire.DecodeServerMessage(b, wire.NewestVersion)
		if err != nil {
			t.Fatal(err)
		}
		if p := m.(*wire.NarPush); p.Offset != uint64(i) {
			t.Fatalf("frame %d is offset %d", i, p.Offset)
		}
	}
	w.Close()
	<-w.Done()
	f, _ := w.Encode(narPush(0, 10))
	if _, err := w.Offer(f); !errors.Is(err, ErrClosed) {
		t.Fatalf("offer after close: %v", err)
	}
}

// Small ready bulk messages join a control batch (for a transport that
// gathers a batch into one write); a large one is held and opens the next
// bulk batch, and the order of each lane is kept.
func TestSmallBulkJoinsControlBatch(t *testing.T) {
	q := newQueues()
	q.control <- []byte("ctl")
	q.bulk <- []byte("done-1")
	q.bulk <- []byte("done-2")
	q.bulk <- bytes.Repeat([]byte{9}, 100<<10)
	q.bulk <- []byte("done-3")
	stop := make(chan struct{})
	batch, lane := q.next(nil, stop, nil)
	batch = q.appendSmallBulk(batch, 8<<10, 64<<10)
	if lane != ControlLane || len(batch) != 3 || string(batch[0]) != "ctl" || string(batch[1]) != "done-1" || string(batch[2]) != "done-2" {
		t.Fatalf("first batch: %v %q", lane, batch)
	}
	batch, lane = q.next(batch, stop, nil)
	if lane != BulkLane || len(batch) != 2 || len(batch[0]) != 100<<10 || string(batch[1]) != "done-3" {
		t.Fatalf("second batch: %v × %d", lane, len(batch))
	}
	// Nothing on the control lane: a bulk batch stays a bulk batch.
	if got := q.appendSmallBulk(nil, 8<<10, 64<<10); len(got) != 0 {
		t.Fatalf("appended %d from empty lanes", len(got))
	}
}
