// Package limit holds the connection limiters of docs/protocol/session.md §9: a global
// cap on sessions (an upgrade beyond it is refused with HTTP 503 instead of
// queueing) and a per-IP cap for anonymous cache sessions. Neither waits:
// a permit is taken at once or refused. Failures (failures.go) limits
// failed authentications per client address the same way.
package limit

import (
	"sync"
)

// Global is a counting semaphore over every session.
type Global struct {
	permits chan struct{}
}

// NewGlobal sizes the limiter; 0 is clamped to 1.
func NewGlobal(capacity int) *Global {
	return &Global{permits: make(chan struct{}, max(capacity, 1))}
}

// TryAcquire takes a permit without waiting; release returns it (calling
// release more than once is harmless).
func (g *Global) TryAcquire() (release func(), ok bool) {
	select {
	case g.permits <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-g.permits }) }, true
	default:
		return nil, false
	}
}

// Capacity is the number of permits; InUse how many are held.
func (g *Global) Capacity() int { return cap(g.permits) }
func (g *Global) InUse() int    { return len(g.permits) }

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
