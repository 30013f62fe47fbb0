package session

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"gradient.dev/gradient/wire"
)

// DefaultSendTimeout is how long a send waits for lane space when the
// caller chose nothing.
const DefaultSendTimeout = 30 * time.Second

// Writer is the sending half of a split session: senders encode at the
// agreed version and enqueue on the control or bulk lane; one task writes
// batches to the transport. Safe for concurrent use; share the pointer.
type Writer[M wire.Message] struct {
	t           Transport
	ver         uint16
	codec       Codec[M]
	sendTimeout time.Duration
	log         *slog.Logger
	q           *queues

	mu     sync.RWMutex // senders hold it shared; Close exclusively
	closed bool
	stop   chan struct{} // closed by Close: drain and end
	done   chan struct{} // closed when the task ended
	ctx    context.Context
	cancel context.CancelFunc
	err    error // why the task ended, readable after done
	onFail func(error)

	stalls [2]atomic.Uint64
}

// NewWriter starts the writer task for transport t at version ver.
// sendTimeout bounds how long Send waits for lane space (0 means
// DefaultSendTimeout).
func NewWriter[M wire.Message](t Transport, ver uint16, codec Codec[M], sendTimeout time.Duration, log *slog.Logger) *Writer[M] {
	return newWriter(t, ver, codec, sendTimeout, log, nil)
}

// newWriter also takes onFail, called from the task when a write fails.
func newWriter[M wire.Message](t Transport, ver uint16, codec Codec[M], sendTimeout time.Duration, log *slog.Logger, onFail func(error)) *Writer[M] {
	if sendTimeout <= 0 {
		sendTimeout = DefaultSendTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Writer[M]{
		t: t, ver: ver, codec: codec, sendTimeout: sendTimeout, log: logger(log), q: newQueues(),
		stop: make(chan struct{}), done: make(chan struct{}), ctx: ctx, cancel: cancel, onFail: onFail,
	}
	go w.run()
	return w
}

// Version is the agreed protocol version, for feature checks.
func (w *Writer[M]) Version() uint16 { return w.ver }

// Send encodes m and queues it on its lane. It fails with an *EncodeError
// if the agreed version cannot carry m, ErrStalled if the lane stayed full
// for the send timeout, and ErrClosed once the writer is gone.
func (w *Writer[M]) Send(m M) error {
	f, err := w.Encode(m)
	if err != nil {
		return err
	}
	return w.enqueue(f.lane, f.b)
}

// Frame is a message encoded at a writer's version, not yet queued. It
// refers to nothing of the message it was encoded from.
type Frame struct {
	b    []byte
	lane Lane
}

// Size is the encoded message's length.
func (f Frame) Size() int { return len(f.b) }

// Encode encodes m (the one copy of its payload) for SendFrame or
// Offer, which take the frame over. It fails with an *EncodeError like
// Send.
func (w *Writer[M]) Encode(m M) (Frame, error) {
	b, err := w.codec.Append(getBuffer(), m, w.ver)
	if err == nil {
		err = checkSize(len(b))
	}
	if err != nil {
		putBuffer(b)
		return Frame{}, &EncodeError{Variant: m.WireName(), Err: err}
	}
	return Frame{b: b, lane: w.codec.Lane(m)}, nil
}

// Relay makes frame, received at version ver (Reader.Frame) and decoded
// as m, a Frame of this writer without copying it, when this writer's
// version encodes m's variant byte for byte alike; otherwise it encodes
// m (relayed false). A relayed frame's buffer is the Frame's from then
// on, queued or not: the reader must Forget it, and neither m's byte
// fields nor frame may be read again, since the writer recycles the
// buffer once written. Its size is checked like an encoded message's.
func (w *Writer[M]) Relay(frame []byte, ver uint16, m M) (f Frame, relayed bool, err error) {
	tag, ok := wire.FrameTag(frame)
	if !ok || w.codec.SameEncoding == nil || !w.codec.SameEncoding(tag, ver, w.ver) {
		f, err = w.Encode(m)
		return f, false, err
	}
	if err := checkSize(len(frame)); err != nil {
		return Frame{}, false, &EncodeError{Variant: m.WireName(), Err: err}
	}
	return Frame{b: frame, lane: w.codec.Lane(m)}, true, nil
}

// SendFrame queues f like Send queues a message.
func (w *Writer[M]) SendFrame(f Frame) error { return w.enqueue(f.lane, f.b) }

// Offer queues f only if its lane has room now: false (f still the
// caller's) when the lane is full, ErrClosed once the writer is gone.
func (w *Writer[M]) Offer(f Frame) (bool, error) {
	ch := w.q.control
	if f.lane == BulkLane {
		ch = w.q.bulk
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed || w.ctx.Err() != nil {
		return false, ErrClosed
	}
	select {
	case ch <- f.b:
		return true, nil
	default:
		return false, nil
	}
}

func (w *Writer[M]) enqueue(lane Lane, b []byte) error {
	ch := w.q.control
	if lane == BulkLane {
		ch = w.q.bulk
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return ErrClosed
	}
	select {
	case ch <- b:
		return nil
	case <-w.done:
		return ErrClosed
	case <-w.ctx.Done():
		return ErrClosed
	default:
	}
	timer := time.NewTimer(w.sendTimeout)
	defer timer.Stop()
	select {
	case ch <- b:
		return nil
	case <-w.done:
		return ErrClosed
	case <-w.ctx.Done():
		return ErrClosed
	case <-timer.C:
		w.stalls[lane].Add(1)
		w.log.Warn("send stalled", "lane", lane.String(), "timeout", w.sendTimeout)
		return ErrStalled
	}
}

// Stalls counts sends that failed as ErrStalled, per lane.
func (w *Writer[M]) Stalls(lane Lane) uint64 { return w.stalls[lane].Load() }

// Queued is the fill of a lane (messages waiting for the task).
func (w *Writer[M]) Queued(lane Lane) int {
	if lane == BulkLane {
		return len(w.q.bulk)
	}
	return len(w.q.control)
}

// Close stops accepting messages; the task writes what is queued and ends.
// It does not wait: see Done, or Abort to stop at once.
func (w *Writer[M]) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
}

// Abort ends the task without draining: a write in progress is cancelled
// and blocked senders return ErrClosed at once.
func (w *Writer[M]) Abort() {
	w.cancel()
	w.Close()
}

// Done is closed when the writer task has ended.
func (w *Writer[M]) Done() <-chan struct{} { return w.done }

// Err is why the task ended (nil after a clean Close), valid after Done.
func (w *Writer[M]) Err() error { return w.err }

func (w *Writer[M]) run() {
	defer func() {
		w.cancel()
		close(w.done)
		if w.err != nil && w.onFail != nil {
			w.onFail(w.err)
		}
	}()
	batch := make([][]byte, 0, 2*WriteBatch)
	for {
		var lane Lane
		batch, lane = w.q.next(batch, w.stop, w.ctx.Done())
		batch = w.gather(batch, lane)
		if w.ctx.Err() != nil {
			return // aborted: nothing more is written
		}
		if len(batch) == 0 {
			w.err = w.drain(batch)
			return
		}
		if err := w.write(batch); err != nil {
			w.err = err
			w.log.Debug("writer ended", "lane", lane.String(), "error", err)
			return
		}
	}
}

// drain writes what is left after Close: no sender can enqueue any more.
func (w *Writer[M]) drain(batch [][]byte) error {
	for {
		var lane Lane
		batch, lane = w.q.next(batch, closedChan, nil)
		batch = w.gather(batch, lane)
		if len(batch) == 0 {
			return nil
		}
		if err := w.write(batch); err != nil {
			return err
		}
	}
}

// gather lets small ready bulk messages join a control batch when the
// transport sends a batch's small frames in one write.
func (w *Writer[M]) gather(batch [][]byte, lane Lane) [][]byte {
	if _, ok := w.t.(batchWriter); !ok || lane != ControlLane || len(batch) == 0 {
		return batch
	}
	return w.q.appendSmallBulk(batch, coalesceFrame-maxFrameHeader, coalesceBytes)
}

// maxFrameHeader is the longest WebSocket frame header (RFC 6455: 2 bytes,
// 8 of extended length, 4 of mask key).
const maxFrameHeader = 14

// batchWriter is a transport that sends a batch of messages with fewer
// system calls than one write each (a WebSocket gathers small frames).
type batchWriter interface {
	WriteMessages(ctx context.Context, batch [][]byte) error
}

// write feeds a batch to the transport: in one call if it gathers small
// messages into few writes, else message by message.
func (w *Writer[M]) write(batch [][]byte) error {
	defer func() {
		for i, b := range batch {
			recycle(b)
			batch[i] = nil
		}
	}()
	if bw, ok := w.t.(batchWriter); ok {
		return bw.WriteMessages(w.ctx, batch)
	}
	for _, b := range batch {
		if err := w.t.WriteMessage(w.ctx, b); err != nil {
			return err
		}
	}
	return nil
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
