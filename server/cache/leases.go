package cache

import (
	"context"
	"sync"
)

// uploadLeases make concurrent uploads of one store path end as one
// object: the first request leads; the others wait for its outcome and
// get Skip when it stored the path, or take over when it failed
// (docs/protocol/cache.md §4.3, "requests for the same object coalesce").
type uploadLeases struct {
	mu     sync.Mutex
	byHash map[string]*uploadLease
}

type uploadLease struct {
	hash   string
	done   chan struct{}
	stored bool // valid once done is closed
}

func newUploadLeases() *uploadLeases { return &uploadLeases{byHash: map[string]*uploadLease{}} }

// acquire returns a lease on the store hash, waiting while another upload
// holds it. If that upload stored the path, it returns nil and
// storedMeanwhile.
func (l *uploadLeases) acquire(ctx context.Context, hash string) (lease *uploadLease, storedMeanwhile bool, err error) {
	for {
		l.mu.Lock()
		cur := l.byHash[hash]
		if cur == nil {
			lease = &uploadLease{hash: hash, done: make(chan struct{})}
			l.byHash[hash] = lease
			l.mu.Unlock()
			return lease, false, nil
		}
		l.mu.Unlock()
		select {
		case <-cur.done:
			if cur.stored {
				return nil, true, nil
			}
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// release ends a lease, telling waiters whether the path is stored.
func (l *uploadLeases) release(lease *uploadLease, stored bool) {
	if lease == nil {
		return
	}
	l.mu.Lock()
	if l.byHash[lease.hash] == lease {
		delete(l.byHash, lease.hash)
	}
	l.mu.Unlock()
	lease.stored = stored
	close(lease.done)
}
