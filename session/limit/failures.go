package limit

import (
	"net/netip"
	"sync"
	"time"
)

// Failures limits failed authentications per client address: an address
// may fail perWindow times at once and regains one attempt every
// window/perWindow (a token bucket, kept as the time its bucket is full
// again). An address out of attempts is refused, credentials unchecked,
// until it regains one; a whole window without failures restores all of
// them. Successes cost nothing, so valid clients never notice it.
type Failures struct {
	interval time.Duration // regaining one attempt
	window   time.Duration
	now      func() time.Time

	mu sync.Mutex
	// full is when each address's bucket is full again; an address whose
	// time has passed is forgotten.
	full    map[string]time.Time
	sweepAt int
}

// maxTrackedFailures bounds the addresses remembered at once. Past it new
// addresses go uncounted: an attacker with that many addresses is beyond
// what a per-address limit can stop, and clearing the map instead would
// free the addresses already held back.
const maxTrackedFailures = 1 << 16

// NewFailures allows perWindow failures per window and address (perWindow
// is clamped to 1, window to a millisecond); now is the clock (nil:
// time.Now).
func NewFailures(perWindow int, window time.Duration, now func() time.Time) *Failures {
	window = max(window, time.Millisecond)
	if now == nil {
		now = time.Now
	}
	return &Failures{interval: window / time.Duration(max(perWindow, 1)), window: window, now: now,
		full: map[string]time.Time{}, sweepAt: 1024}
}

// Blocked reports whether addr has no attempts left, and how long until
// it regains one.
func (f *Failures) Blocked(addr string) (retryAfter time.Duration, blocked bool) {
	key := AddressKey(addr)
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	full, ok := f.full[key]
	if !ok {
		return 0, false
	}
	// Spent attempts are (full-now)/interval; the last one is spent when
	// that exceeds the window less one interval.
	wait := full.Sub(now) - (f.window - f.interval)
	return wait, wait > 0
}

// Fail records a failed authentication of addr.
func (f *Failures) Fail(addr string) {
	key := AddressKey(addr)
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	full, ok := f.full[key]
	if !ok {
		if len(f.full) >= f.sweepAt {
			f.sweep(now)
		}
		if len(f.full) >= maxTrackedFailures {
			return
		}
	}
	if full.Before(now) {
		full = now
	}
	// Requests that passed Blocked together may fail together: still no
	// address owes more than one window.
	full = full.Add(f.interval)
	if limit := now.Add(f.window); full.After(limit) {
		full = limit
	}
	f.full[key] = full
}

// sweep forgets addresses whose buckets are full again.
func (f *Failures) sweep(now time.Time) {
	for k, full := range f.full {
		if !full.After(now) {
			delete(f.full, k)
		}
	}
	f.sweepAt = max(1024, 2*len(f.full))
}

// Tracked is how many addresses have failures on record.
func (f *Failures) Tracked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.full)
}

// AddressKey is the unit a per-address limit counts: an IPv4 address, or
// the /64 of an IPv6 address (one host commonly holds a whole /64).
// Anything that does not parse counts as itself.
func AddressKey(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	prefix, _ := ip.WithZone("").Prefix(64)
	return prefix.String()
}
