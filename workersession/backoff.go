package workersession

import (
	"math/rand/v2"
	"time"
)

// backoff is the reconnect delay (docs/protocol/worker.md §3): initial, doubling up to max
// while attempts fail, back to initial after a session that served work.
type backoff struct {
	initial, max, next time.Duration
}

func newBackoff(initial, max time.Duration) *backoff {
	return &backoff{initial: initial, max: max, next: initial}
}

// delay returns the wait before the next attempt and doubles the one after.
func (b *backoff) delay() time.Duration {
	d := b.next
	b.next = min(b.next*2, b.max)
	return d
}

func (b *backoff) reset() { b.next = b.initial }

// Jitter shortens d by up to a fifth at random, so workers that lost the
// same server reconnect spread out instead of arriving together on every
// doubling.
func Jitter(d time.Duration) time.Duration {
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}
