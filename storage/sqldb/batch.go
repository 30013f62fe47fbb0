package sqldb

import (
	"context"
	"fmt"
	"sync"
)

// Batcher runs concurrent calls of one operation together, one statement
// for many calls (group commit). A call that finds no batch running runs
// at once, alone; calls arriving while a batch runs wait and go together
// in the next one. So an idle server pays nothing extra, and under load
// the fixed cost of a statement (executor start-up on every table it
// touches, a commit) is shared by everyone who waited for it.
//
// At most Lanes batches run at once (one when unset); the caller whose
// call is first in line runs the next batch, so no goroutine lives
// behind the batcher.
type Batcher[In, Out any] struct {
	// Run executes a batch and returns one result per input, in order.
	// When a batch of several fails, each call runs again alone, so an
	// error reaches only the calls it belongs to.
	Run   func(ctx context.Context, ins []In) ([]Out, error)
	Max   int // most calls per batch
	Lanes int // most batches at once

	mu      sync.Mutex
	running int
	waiting []*batchCall[In, Out]
}

type batchCall[In, Out any] struct {
	in    In
	out   Out
	err   error
	batch []*batchCall[In, Out] // set when this call's goroutine is to run it
	ready chan struct{}         // closed when out/err or batch are set
}

// Do runs in as part of a batch and returns its result.
func (b *Batcher[In, Out]) Do(ctx context.Context, in In) (Out, error) {
	c := &batchCall[In, Out]{in: in, ready: make(chan struct{})}
	b.mu.Lock()
	b.waiting = append(b.waiting, c)
	var calls []*batchCall[In, Out]
	if b.running < max(b.Lanes, 1) {
		// A free lane means nobody was waiting: c is first in line.
		b.running++
		calls = b.next()
		b.mu.Unlock()
	} else {
		b.mu.Unlock()
		<-c.ready // a batch never outlives its statement; no cancel here
		if c.batch == nil {
			return c.out, c.err
		}
		calls = c.batch
	}

	// The batch must finish for everyone in it, whatever happens to the
	// leader's own request.
	b.runBatch(context.WithoutCancel(ctx), calls)

	b.mu.Lock()
	var next []*batchCall[In, Out]
	if len(b.waiting) > 0 {
		next = b.next() // this lane goes on with the calls that waited
	} else {
		b.running--
		b.waiting = nil // let the backing array go
	}
	b.mu.Unlock()
	if next != nil {
		next[0].batch = next
		close(next[0].ready)
	}
	for _, other := range calls {
		if other != c {
			close(other.ready)
		}
	}
	return c.out, c.err
}

// next takes the calls of the next batch off the line.
func (b *Batcher[In, Out]) next() []*batchCall[In, Out] {
	n := min(len(b.waiting), b.Max)
	calls := b.waiting[:n:n]
	b.waiting = b.waiting[n:]
	return calls
}

func (b *Batcher[In, Out]) runBatch(ctx context.Context, calls []*batchCall[In, Out]) {
	ins := make([]In, len(calls))
	for i, c := range calls {
		ins[i] = c.in
	}
	outs, err := b.Run(ctx, ins)
	if err == nil && len(outs) != len(calls) {
		err = fmt.Errorf("sqldb: a batch of %d calls returned %d results", len(calls), len(outs))
	}
	if err == nil {
		for i, c := range calls {
			c.out = outs[i]
		}
		return
	}
	if len(calls) == 1 {
		calls[0].err = err
		return
	}
	for _, c := range calls {
		b.runBatch(ctx, []*batchCall[In, Out]{c})
	}
}

// Running is how many batches run now.
func (b *Batcher[In, Out]) Running() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.running
}

// Waiting is how many calls wait for a batch.
func (b *Batcher[In, Out]) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiting)
}
