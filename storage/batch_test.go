package storage

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// Calls that arrive while a batch runs go together in the next one, and
// each gets its own result.
func TestBatcherGroupsWaitingCalls(t *testing.T) {
	release := make(chan struct{})
	var batches, biggest atomic.Int64
	b := &batcher[int, int]{
		max: 64,
		single: func(_ context.Context, in int) (int, error) {
			<-release // the first call holds the line until all have queued
			return in * 10, nil
		},
		run: func(_ context.Context, ins []int) ([]batchResult[int], error) {
			batches.Add(1)
			if n := int64(len(ins)); n > biggest.Load() {
				biggest.Store(n)
			}
			out := make([]batchResult[int], len(ins))
			for i, in := range ins {
				out[i].out = in * 10
			}
			return out, nil
		},
	}
	const calls = 40
	results := make([]int, calls)
	var wg sync.WaitGroup
	wg.Go(func() { results[0], _ = b.do(t.Context(), 0) })
	for !b.isRunning() {
		runtime.Gosched()
	}
	for i := 1; i < calls; i++ {
		wg.Go(func() { results[i], _ = b.do(t.Context(), i) })
	}
	for b.waitingCount() < calls-1 {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	for i, r := range results {
		if r != i*10 {
			t.Fatalf("call %d got %d, want %d", i, r, i*10)
		}
	}
	if batches.Load() != 1 || biggest.Load() != calls-1 {
		t.Fatalf("%d batches, biggest %d; want the %d waiting calls in one", batches.Load(), biggest.Load(), calls-1)
	}
}

// A failed batch statement fails nobody: each call runs alone, and gets
// its own error.
func TestBatcherFallsBackToSingleCalls(t *testing.T) {
	errOdd := errors.New("odd")
	release := make(chan struct{})
	b := &batcher[int, int]{
		max: 8,
		single: func(_ context.Context, in int) (int, error) {
			if in == 0 {
				<-release
			}
			if in%2 == 1 {
				return 0, errOdd
			}
			return in, nil
		},
		run: func(context.Context, []int) ([]batchResult[int], error) {
			return nil, errors.New("statement failed")
		},
	}
	var wg sync.WaitGroup
	errs := make([]error, 20)
	outs := make([]int, 20)
	wg.Go(func() { outs[0], errs[0] = b.do(t.Context(), 0) })
	for !b.isRunning() {
		runtime.Gosched()
	}
	for i := 1; i < 20; i++ {
		wg.Go(func() { outs[i], errs[i] = b.do(t.Context(), i) })
	}
	for b.waitingCount() < 19 {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	for i := range 20 {
		if i%2 == 1 && !errors.Is(errs[i], errOdd) || i%2 == 0 && (errs[i] != nil || outs[i] != i) {
			t.Errorf("call %d: %d, %v", i, outs[i], errs[i])
		}
	}
	if b.isRunning() {
		t.Error("batcher still marked running after every call returned")
	}
}

// Under a storm of calls, with batches bounded by max and two running at
// once, no call is lost or answered twice, and the batcher ends idle.
func TestBatcherStorm(t *testing.T) {
	var served, running, most atomic.Int64
	b := &batcher[int, int]{
		max:    5,
		lanes:  2,
		single: func(_ context.Context, in int) (int, error) { served.Add(1); return in + 1, nil },
		run: func(_ context.Context, ins []int) ([]batchResult[int], error) {
			if len(ins) > 5 {
				t.Errorf("batch of %d, max 5", len(ins))
			}
			n := running.Add(1)
			defer running.Add(-1)
			if n > most.Load() {
				most.Store(n)
			}
			runtime.Gosched()
			served.Add(int64(len(ins)))
			out := make([]batchResult[int], len(ins))
			for i, in := range ins {
				out[i].out = in + 1
			}
			return out, nil
		},
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 500 {
				in := g*1000 + i
				if out, err := b.do(t.Context(), in); err != nil || out != in+1 {
					t.Errorf("do(%d) = %d, %v", in, out, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if served.Load() != 16*500 || b.isRunning() {
		t.Fatalf("served %d of %d calls; running %v", served.Load(), 16*500, b.isRunning())
	}
	if most.Load() > 2 {
		t.Fatalf("%d batches ran at once, lanes 2", most.Load())
	}
}

func (b *batcher[In, Out]) isRunning() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.running > 0
}

func (b *batcher[In, Out]) waitingCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiting)
}
