package limit

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// manualClock is a clock tests move by hand.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestFailuresBlockAfterTheLimitAndRecover(t *testing.T) {
	clock := &manualClock{t: time.Unix(1_000_000, 0)}
	f := NewFailures(5, time.Minute, clock.now)
	for i := range 5 {
		if _, blocked := f.Blocked("192.0.2.1"); blocked {
			t.Fatalf("blocked after %d failures, want 5 allowed", i)
		}
		f.Fail("192.0.2.1")
	}
	wait, blocked := f.Blocked("192.0.2.1")
	if !blocked || wait <= 0 || wait > 12*time.Second {
		t.Fatalf("after 5 failures: blocked %v, retry after %v (want ≤ one attempt's 12s)", blocked, wait)
	}
	if _, blocked := f.Blocked("192.0.2.2"); blocked {
		t.Fatal("another address is blocked too")
	}
	// One attempt comes back after window/limit.
	clock.advance(wait)
	if _, blocked := f.Blocked("192.0.2.1"); blocked {
		t.Fatalf("still blocked after the announced %v", wait)
	}
	f.Fail("192.0.2.1")
	if _, blocked := f.Blocked("192.0.2.1"); !blocked {
		t.Fatal("the regained attempt did not run out")
	}
	// A quiet window restores every attempt and forgets the address.
	clock.advance(time.Minute)
	for range 4 {
		f.Fail("192.0.2.1")
	}
	if _, blocked := f.Blocked("192.0.2.1"); blocked {
		t.Fatal("a window after the last failure, 4 failures block")
	}
	clock.advance(2 * time.Minute)
	f.Fail("192.0.2.9") // a new address triggers no sweep below 1024
	if f.Tracked() != 2 {
		t.Fatalf("tracked %d", f.Tracked())
	}
}

func TestFailuresCountIPv6PerSlash64(t *testing.T) {
	f := NewFailures(2, time.Minute, nil)
	f.Fail("2001:db8:1:2::1")
	f.Fail("2001:db8:1:2:ffff::7")
	if _, blocked := f.Blocked("2001:db8:1:2::99"); !blocked {
		t.Fatal("addresses of one /64 are counted apart")
	}
	if _, blocked := f.Blocked("2001:db8:1:3::1"); blocked {
		t.Fatal("another /64 is blocked")
	}
	f.Fail("::ffff:192.0.2.7")
	f.Fail("192.0.2.7")
	if _, blocked := f.Blocked("192.0.2.7"); !blocked {
		t.Fatal("a v4-mapped address is counted apart from its IPv4 form")
	}
}

func TestFailuresForgetRecoveredAddresses(t *testing.T) {
	clock := &manualClock{t: time.Unix(1_000_000, 0)}
	f := NewFailures(3, time.Minute, clock.now)
	for i := range 5000 {
		f.Fail(fmt.Sprintf("10.0.%d.%d", i/256, i%256))
	}
	clock.advance(time.Minute)
	for i := range 5000 {
		f.Fail(fmt.Sprintf("10.1.%d.%d", i/256, i%256))
	}
	if n := f.Tracked(); n > 6000 {
		t.Fatalf("%d addresses tracked, want the 5000 refilled ones swept", n)
	}
}
