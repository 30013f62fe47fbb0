package session

import (
	"context"
	"sync"
	"sync/atomic"
)

// cancelWatch closes a transport when the context of a read (or a write)
// in progress ends: gorilla cannot abandon either half-way. A session
// passes the same context to every read (its lifetime) and every write
// (the writer's), so the watch registers context.AfterFunc once per
// context, not once per message, and keeps it between operations; busy
// tells the callback whether an operation is under way. A context that
// ends between operations closes nothing (a writer cancels its own
// context when it ends cleanly); the next operation under it finds it
// done and closes then, as before.
//
// One watch serves one kind of operation, which the transport already
// serialises (reads by rsem, writes by wmu), so begin and end never race
// with each other; only the callback and release run concurrently.
type cancelWatch struct {
	onCancel func(context.Context)
	// firedHook, if set (tests), runs after each callback.
	firedHook func()

	busy atomic.Bool

	mu   sync.Mutex      // guards the fields below against release
	done <-chan struct{} // of the watched context
	stop func() bool
	dead bool
}

// begin marks an operation under ctx as started. It reports false if ctx
// had already ended: the transport is being closed and the operation must
// not start.
func (w *cancelWatch) begin(ctx context.Context) bool {
	done := ctx.Done()
	if done == nil {
		return true // never cancelled
	}
	w.mu.Lock()
	if done != w.done && !w.dead {
		// A context with the same Done channel ends with the same error
		// and cause (a value context, a wrapper), so it shares the watch.
		if w.stop != nil {
			w.stop()
		}
		w.done = done
		w.stop = context.AfterFunc(ctx, func() { w.fired(ctx) })
	}
	w.mu.Unlock()
	// Publish busy before looking at ctx: either this sees the end, or the
	// callback (which runs after the end) sees busy.
	w.busy.Store(true)
	if ctx.Err() != nil {
		w.busy.Store(false)
		w.onCancel(ctx)
		return false
	}
	return true
}

// end marks the operation as finished.
func (w *cancelWatch) end() { w.busy.Store(false) }

// fired runs once ctx ended. A context replaced in the meantime (its
// callback already running when stop was called) closes nothing.
func (w *cancelWatch) fired(ctx context.Context) {
	if w.firedHook != nil {
		defer w.firedHook()
	}
	if !w.busy.Load() {
		return
	}
	w.mu.Lock()
	current := w.done == ctx.Done()
	w.mu.Unlock()
	if current {
		w.onCancel(ctx)
	}
}

// release unregisters the callback for good (the socket is closed), so a
// long-lived context does not keep the transport reachable.
func (w *cancelWatch) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		w.stop()
	}
	w.stop, w.done, w.dead = nil, nil, true
}
