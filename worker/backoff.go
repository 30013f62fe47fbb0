package worker

import "time"

// backoff is the reconnect delay (WORKER.md §3): initial, doubling up to max
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
