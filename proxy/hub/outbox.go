package hub

import (
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
// sends never block: one goroutine hands the messages to the session in
// order. A worker that reads slower than its tenant's server sends — its
// queue overflows, or the session's own send stalls — is cut off, as
// nats-server cuts off a slow consumer, instead of stalling the tenant's
// upstream reader and with it every other worker of the tenant.
type Outbox struct {
	send   func(wire.ServerMessage) error
	onSlow func(reason string)
	wait   func(time.Duration)

	mu     sync.Mutex
	q      []queued
	bytes  int
	closed bool
	// finishing: Finish was called; later messages are dropped.
	finishing bool
	wake      chan struct{}
	stopped   chan struct{}
}

type queued struct {
	m    wire.ServerMessage
	size int
	at   time.Time
	then func() // Finish's: run after what was queued before it, then stop
}

// NewOutbox starts the queue of a session whose send is send; onSlow is
// called once (off the sender's goroutine) when the worker is cut off,
// and should close the session. Close stops it.
func NewOutbox(send func(wire.ServerMessage) error, onSlow func(reason string)) *Outbox {
	o := &Outbox{send: send, onSlow: onSlow, wait: func(time.Duration) {}, wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	go o.loop()
	return o
}

// observe sets the queue-wait observer (metrics).
func (o *Outbox) observe(f func(time.Duration)) { o.wait = f }

// Send queues m; it never blocks. Once the queue is cut off or closed m
// is dropped.
func (o *Outbox) Send(m wire.ServerMessage) {
	size := messageSize(m)
	o.mu.Lock()
	if o.closed || o.finishing {
		o.mu.Unlock()
		return
	}
	if len(o.q) >= OutboxMessages || o.bytes+size > OutboxBytes {
		o.cutOffLocked("outgoing queue full: worker too slow")
		o.mu.Unlock()
		return
	}
	o.q = append(o.q, queued{m: m, size: size, at: time.Now()})
	o.bytes += size
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *Outbox) cutOffLocked(reason string) {
	o.closed = true
	o.q, o.bytes = nil, 0
	close(o.stopped)
	go o.onSlow(reason)
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
	if !o.closed {
		o.closed = true
		o.q, o.bytes = nil, 0
		close(o.stopped)
	}
}

func (o *Outbox) loop() {
	for {
		o.mu.Lock()
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
		o.mu.Unlock()
		if next.then != nil {
			next.then()
			o.Close()
			return
		}
		o.wait(time.Since(next.at))
		if err := o.send(next.m); err != nil {
			o.mu.Lock()
			switch {
			case o.closed:
			case errors.Is(err, session.ErrStalled):
				o.cutOffLocked("the session's send stalled: worker too slow")
			default: // the session is gone
				o.closed = true
				o.q, o.bytes = nil, 0
				close(o.stopped)
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
