// Package limit holds the connection limiters: an authority's connection
// budget (Budget, budget.go: a total, a share for unauthenticated
// sessions, a cap per address prefix, shedding the oldest unauthenticated
// session rather than refusing) and a per-IP cap for anonymous cache
// sessions. None waits: a permit is taken at once or
// refused. Failures (failures.go) limits failed authentications per
// client address the same way.
package limit

import (
	"sync"
)

// PerIP caps connections per client IP. An IP's entry exists only while it
// holds permits, so the map never outgrows the live connections.
type PerIP struct {
	mu    sync.Mutex
	limit int
	inUse map[string]int
}

// NewPerIP allows perIP connections per address; 0 is clamped to 1.
func NewPerIP(perIP int) *PerIP {
	return &PerIP{limit: max(perIP, 1), inUse: map[string]int{}}
}

// TryAcquire takes a permit for ip without waiting.
func (p *PerIP) TryAcquire(ip string) (release func(), ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inUse[ip] >= p.limit {
		return nil, false
	}
	p.inUse[ip]++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.inUse[ip]--; p.inUse[ip] <= 0 {
				delete(p.inUse, ip)
			}
		})
	}, true
}

// InUse is how many permits ip holds; Tracked how many IPs hold any.
func (p *PerIP) InUse(ip string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inUse[ip]
}

func (p *PerIP) Tracked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.inUse)
}
