package sqldb

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// times10 answers each input with ten times it; the first batch waits
// for release when hold is set and it carries input 0.
func times10(ins []int, hold chan struct{}) []int {
	if hold != nil && len(ins) == 1 && ins[0] == 0 {
		<-hold
	}
	out := make([]int, len(ins))
	for i, in := range ins {
		out[i] = in * 10
	}
	return out
}

// startHeld starts call 0, which holds the only lane, then calls
// 1..n-1, and returns once all of those wait in line.
func startHeld(t *testing.T, b *Batcher[int, int], n int, call func(i int)) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() { call(0) })
	for b.Running() == 0 {
		runtime.Gosched()
	}
	for i := 1; i < n; i++ {
		wg.Go(func() { call(i) })
	}
	for b.Waiting() < n-1 {
		runtime.Gosched()
	}
	return &wg
}

// Calls that arrive while a batch runs go together in the next one, and
// each gets its own result.
func TestBatcherGroupsWaitingCalls(t *testing.T) {
	release := make(chan struct{})
	var batches, biggest atomic.Int64
	b := &Batcher[int, int]{Max: 64, Run: func(_ context.Context, ins []int) ([]int, error) {
		if len(ins) > 1 {
			batches.Add(1)
			biggest.Store(max(biggest.Load(), int64(len(ins))))
		}
		return times10(ins, release), nil
	}}
	const calls = 40
	results := make([]int, calls)
	wg := startHeld(t, b, calls, func(i int) { results[i], _ = b.Do(t.Context(), i) })
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

// A failed batch fails nobody by itself: each call runs alone, and gets
// only its own error.
func TestBatcherFallsBackToSingleCalls(t *testing.T) {
	errOdd := errors.New("odd")
	release := make(chan struct{})
	b := &Batcher[int, int]{Max: 8, Run: func(_ context.Context, ins []int) ([]int, error) {
		if len(ins) > 1 {
			return nil, errors.New("statement failed")
		}
		if ins[0]%2 == 1 {
			return nil, errOdd
		}
		return times10(ins, release), nil
	}}
	errs, outs := make([]error, 20), make([]int, 20)
	wg := startHeld(t, b, 20, func(i int) { outs[i], errs[i] = b.Do(t.Context(), i) })
	close(release)
	wg.Wait()
	for i := range 20 {
		if i%2 == 1 && !errors.Is(errs[i], errOdd) || i%2 == 0 && (errs[i] != nil || outs[i] != i*10) {
			t.Errorf("call %d: %d, %v", i, outs[i], errs[i])
		}
	}
	if b.Running() > 0 {
		t.Error("batcher still marked running after every call returned")
	}
}

// Under a storm of calls, with batches bounded by max and two running at
// once, no call is lost or answered twice, and the batcher ends idle.
func TestBatcherStorm(t *testing.T) {
	var served, running, most atomic.Int64
	b := &Batcher[int, int]{Max: 5, Lanes: 2, Run: func(_ context.Context, ins []int) ([]int, error) {
		if len(ins) > 5 {
			t.Errorf("batch of %d, max 5", len(ins))
		}
		n := running.Add(1)
		defer running.Add(-1)
		most.Store(max(most.Load(), n))
		runtime.Gosched()
		served.Add(int64(len(ins)))
		return times10(ins, nil), nil
	}}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 500 {
				in := g*1000 + i
				if out, err := b.Do(t.Context(), in); err != nil || out != in*10 {
					t.Errorf("do(%d) = %d, %v", in, out, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if served.Load() != 16*500 || b.Running() > 0 {
		t.Fatalf("served %d of %d calls; running %v", served.Load(), 16*500, b.Running() > 0)
	}
	if most.Load() > 2 {
		t.Fatalf("%d batches ran at once, lanes 2", most.Load())
	}
}
