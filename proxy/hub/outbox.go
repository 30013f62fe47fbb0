package hub

import (
	"bytes"
	"errors"
	"sync"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// Outbox limits: a worker that lets this much pile up is cut off.
const (
	OutboxMessages = 4096
	OutboxBytes    = 64 << 20 // 128 NAR chunks of 512 KiB
)

// Outbox is one worker session's bounded outgoing queue, so the hub's
// sends never block. A message goes straight onto the session writer's
// lane when nothing is queued ahead of it and the lane has room (no extra
// goroutine hop); otherwise it waits here and one goroutine hands the
// queue to the session in order. A worker that reads slower than its
// tenant's server sends — its queue overflows, or the session's own send
// stalls — is cut off, as nats-server cuts off a slow consumer, instead of
// stalling the tenant's upstream reader and with it every other worker of
// the tenant. NAR pulls do not get that far: the hub pauses a pull well
// below the limit (Backlog) and resumes it once the queue drained
// (WhenDrained), see narflow.go.
//
// Send keeps nothing of a message's byte fields once it returns: an
// Outbox over a session writer (NewWriterOutbox) encodes the message at
// once, one over a send function copies NarPush and EvalCacheChunk data.
// So the frame a forwarded bulk chunk was decoded from can be reused for
// the next one (Upstream.Handle releases it). Relay instead takes the
// upstream frame of a chunk forwarded unchanged over, so the chunk is
// neither copied nor encoded on its way to the worker.
type Outbox struct {
	sink   sink
	onSlow func(reason string)
	wait   func(time.Duration)

	mu     sync.Mutex
	q      []queued
	bytes  int
	closed bool
	// busy: the loop is handing a message to the session; a new one
	// must queue behind it.
	busy bool
	// finishing: Finish was called; later messages are dropped.
	finishing bool
	// drained is called once the queue holds fewer than drainBelow
	// bytes (WhenDrained); nil when nothing waits for that.
	drained    func()
	drainBelow int
	wake       chan struct{}
	stopped    chan struct{}
}

type queued struct {
	it   item
	size int
	at   time.Time
	then func() // Finish's: run after what was queued before it, then stop
}

// item is a message ready for the session: encoded (a writer sink) or
// the message itself (a send function).
type item struct {
	m wire.ServerMessage
	f session.Frame
}

// sink is how an Outbox reaches its session.
type sink interface {
	// prepare makes m an item that refers to none of m's byte fields.
	prepare(m wire.ServerMessage) (item, int, error)
	// relay makes m an item from frame, the upstream frame m was decoded
	// from at version ver: the frame itself when the sink takes it over
	// (taken), else like prepare.
	relay(m wire.ServerMessage, frame []byte, ver uint16) (it item, size int, taken bool, err error)
	// offer hands it over only if that does not wait.
	offer(it item) (bool, error)
	// send hands it over, waiting up to the session's send timeout.
	send(it item) error
}

type writerSink struct {
	w *session.Writer[wire.ServerMessage]
}

func (s writerSink) prepare(m wire.ServerMessage) (item, int, error) {
	f, err := s.w.Encode(m)
	return item{f: f}, f.Size(), err
}
func (s writerSink) relay(m wire.ServerMessage, frame []byte, ver uint16) (item, int, bool, error) {
	f, taken, err := s.w.Relay(frame, ver, m)
	return item{f: f}, f.Size(), taken, err
}
func (s writerSink) offer(it item) (bool, error) { return s.w.Offer(it.f) }
func (s writerSink) send(it item) error          { return s.w.SendFrame(it.f) }

type funcSink func(wire.ServerMessage) error

func (s funcSink) prepare(m wire.ServerMessage) (item, int, error) {
	switch c := m.(type) {
	case *wire.NarPush:
		d := *c
		d.Data = bytes.Clone(c.Data)
		m = &d
	case *wire.EvalCacheChunk:
		d := *c
		d.Data = bytes.Clone(c.Data)
		m = &d
	}
	return item{m: m}, messageSize(m), nil
}
func (s funcSink) relay(m wire.ServerMessage, _ []byte, _ uint16) (item, int, bool, error) {
	it, size, err := s.prepare(m)
	return it, size, false, err
}
func (s funcSink) offer(item) (bool, error) { return false, nil }
func (s funcSink) send(it item) error       { return s(it.m) }

// NewOutbox starts the queue of a session whose send is send; onSlow is
// called once (off the sender's goroutine) when the worker is cut off,
// and should close the session. Close stops it. Every message crosses
// the Outbox's goroutine; NewWriterOutbox avoids that.
func NewOutbox(send func(wire.ServerMessage) error, onSlow func(reason string)) *Outbox {
	return newOutbox(funcSink(send), onSlow)
}

// NewWriterOutbox is NewOutbox for a session writer: messages are encoded
// by Send and go straight onto the writer's lane while nothing waits
// ahead of them and the lane has room.
func NewWriterOutbox(w *session.Writer[wire.ServerMessage], onSlow func(reason string)) *Outbox {
	return newOutbox(writerSink{w}, onSlow)
}

func newOutbox(s sink, onSlow func(reason string)) *Outbox {
	o := &Outbox{sink: s, onSlow: onSlow, wait: func(time.Duration) {}, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go o.loop()
	return o
}

// observe sets the queue-wait observer (metrics).
func (o *Outbox) observe(f func(time.Duration)) { o.wait = f }

// Send queues m; it never blocks. Once the queue is cut off or closed m
// is dropped, as is a message the session's version cannot carry.
func (o *Outbox) Send(m wire.ServerMessage) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed || o.finishing {
		return
	}
	// Prepared under the lock, so messages keep the order of Send.
	it, size, err := o.sink.prepare(m)
	if err != nil {
		return // an *EncodeError: the session's version cannot carry m
	}
	o.queueLocked(it, size)
}

// Relay is Send for a chunk the hub forwards unchanged: frame, the
// upstream frame m was decoded from at version ver, goes to the worker's
// writer as it came when the worker's version encodes m alike (no copy,
// no encoding: session.Writer.Relay), else m is encoded. It reports
// whether the Outbox took the frame over; then the upstream reader must
// forget it, and nothing may read the frame or m's byte fields again.
func (o *Outbox) Relay(m wire.ServerMessage, frame []byte, ver uint16) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed || o.finishing {
		return false
	}
	it, size, taken, err := o.sink.relay(m, frame, ver)
	if err != nil {
		return taken
	}
	o.queueLocked(it, size)
	return taken
}

func (o *Outbox) queueLocked(it item, size int) {
	if len(o.q) == 0 && !o.busy {
		ok, err := o.sink.offer(it)
		if err != nil {
			o.stopLocked()
			return
		}
		if ok {
			o.wait(0)
			return
		}
	}
	if len(o.q) >= OutboxMessages || o.bytes+size > OutboxBytes {
		o.cutOffLocked("outgoing queue full: worker too slow")
		return
	}
	o.q = append(o.q, queued{it: it, size: size, at: time.Now()})
	o.bytes += size
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// Backlog is the bytes queued and not yet handed to the session.
func (o *Outbox) Backlog() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// WhenDrained calls f once, on a goroutine of its own, when the queue
// holds fewer than below bytes: at once if it does now. It replaces an
// earlier f not yet called; a queue that stops never calls it.
func (o *Outbox) WhenDrained(below int, f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.drained, o.drainBelow = f, below
	o.drainedLocked()
}

func (o *Outbox) drainedLocked() {
	if o.drained != nil && o.bytes < o.drainBelow {
		go o.drained()
		o.drained = nil
	}
}

func (o *Outbox) cutOffLocked(reason string) {
	o.stopLocked()
	go o.onSlow(reason)
}

func (o *Outbox) stopLocked() {
	if !o.closed {
		o.closed = true
		o.q, o.bytes = nil, 0
		o.drained = nil
		close(o.stopped)
	}
}

// Finish runs f (which closes the session) once what is queued now has
// been handed to the session, then stops; later messages are dropped.
func (o *Outbox) Finish(f func()) {
	o.mu.Lock()
	if o.closed || o.finishing {
		o.mu.Unlock()
		return
	}
	o.finishing = true
	o.q = append(o.q, queued{then: f, at: time.Now()})
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// Close stops the queue; what is still queued is dropped.
func (o *Outbox) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stopLocked()
}

func (o *Outbox) loop() {
	for {
		o.mu.Lock()
		o.busy = false
		if o.closed {
			o.mu.Unlock()
			return
		}
		if len(o.q) == 0 {
			o.mu.Unlock()
			select {
			case <-o.wake:
				continue
			case <-o.stopped:
				return
			}
		}
		next := o.q[0]
		o.q[0] = queued{}
		o.q = o.q[1:]
		o.bytes -= next.size
		o.busy = true
		o.drainedLocked()
		o.mu.Unlock()
		if next.then != nil {
			next.then()
			o.Close()
			return
		}
		o.wait(time.Since(next.at))
		if err := o.sink.send(next.it); err != nil {
			o.mu.Lock()
			switch {
			case o.closed:
			case errors.Is(err, session.ErrStalled):
				o.cutOffLocked("the session's send stalled: worker too slow")
			default: // the session is gone
				o.stopLocked()
			}
			o.mu.Unlock()
			return
		}
	}
}

// messageSize is what a message holds in memory, for the byte limit:
// its payload, or a small constant.
func messageSize(m wire.ServerMessage) int {
	const small = 256
	switch m := m.(type) {
	case *wire.NarPush:
		return small + len(m.Data)
	case *wire.EvalCacheChunk:
		return small + len(m.Data)
	case *wire.Credential:
		return small + len(m.Data)
	case *wire.ServerClusterSignal:
		return small + len(m.Payload)
	}
	return small
}
