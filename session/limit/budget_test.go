package limit

import (
	"fmt"
	"testing"
)

// held is one admitted test connection; shed records its closing.
type held struct {
	t    *Ticket
	shed bool
}

func admit(tb testing.TB, b *Budget, addr string) (*held, string) {
	tb.Helper()
	h := &held{}
	t, reason, ok := b.Admit(addr, func() { h.shed = true })
	if !ok {
		tb.Fatalf("%s refused (%s)", addr, reason)
	}
	h.t = t
	return h, reason
}

func TestPrefixKeyGroupsNeighbours(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"127.0.0.2", "127.0.0.6"},
		{"192.0.2.1", "::ffff:192.0.2.200"},
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff::7"},
		{"fe80::1%eth0", "fe80::2"},
	} {
		if PrefixKey(c.a) != PrefixKey(c.b) {
			t.Errorf("%s and %s count apart: %s, %s", c.a, c.b, PrefixKey(c.a), PrefixKey(c.b))
		}
	}
	for _, c := range []struct{ a, b string }{
		{"192.0.2.1", "192.0.3.1"},
		{"2001:db8:1:2::1", "2001:db8:1:3::1"},
	} {
		if PrefixKey(c.a) == PrefixKey(c.b) {
			t.Errorf("%s and %s count together", c.a, c.b)
		}
	}
	if PrefixKey("not an address") != "not an address" {
		t.Error("an unparsable address is not its own key")
	}
}

// Five addresses of one /24 holding 160 sockets keep at most perPrefix;
// each new one sheds the oldest, and a newcomer from the same /24 is
// admitted rather than refused.
func TestBudgetShedsTheOldestOfAPrefixAtItsLimit(t *testing.T) {
	b := NewBudget(256, 128, 32)
	var flood []*held
	for i := range 160 {
		h, _ := admit(t, b, fmt.Sprintf("127.0.0.%d", 2+i%5))
		flood = append(flood, h)
	}
	if b.Pending() != 32 || b.InUse() != 32 {
		t.Fatalf("pending %d, in use %d; want the prefix's 32", b.Pending(), b.InUse())
	}
	for i, h := range flood {
		if want := i < 128; h.shed != want {
			t.Fatalf("socket %d shed %v, want %v (oldest first)", i, h.shed, want)
		}
	}
	w, reason := admit(t, b, "127.0.0.1")
	if reason != ReasonPrefix || !flood[128].shed || w.shed {
		t.Fatalf("newcomer: shed reason %q, oldest held shed %v, newcomer shed %v", reason, flood[128].shed, w.shed)
	}
	// Released and shed tickets give nothing back twice.
	flood[0].t.Release()
	flood[129].t.Release()
	flood[129].t.Release()
	if b.Pending() != 31 || b.InUse() != 31 {
		t.Fatalf("after releases: pending %d, in use %d", b.Pending(), b.InUse())
	}
}

// When the unauthenticated share is full, the heaviest prefix pays: a
// worker from a fresh prefix gets in, and later newcomers of the
// attacker's prefixes never shed it.
func TestBudgetShedsFromTheHeaviestPrefix(t *testing.T) {
	b := NewBudget(16, 8, 4)
	var attacker []*held
	for i := range 8 { // 10.0.0.0/24 holds 4, 10.0.1.0/24 holds 4
		h, _ := admit(t, b, fmt.Sprintf("10.0.%d.%d", i%2, i))
		attacker = append(attacker, h)
	}
	worker, reason := admit(t, b, "192.0.2.7")
	// Both prefixes hold 4: the oldest socket of either is the one shed
	// (attacker[0] of 10.0.0.0/24, attacker[1] of 10.0.1.0/24), nothing else.
	shed := 0
	for _, h := range attacker {
		if h.shed {
			shed++
		}
	}
	if reason != ReasonHandshakes || shed != 1 || !(attacker[0].shed || attacker[1].shed) {
		t.Fatalf("worker admitted with reason %q; shed %d, the oldest of a heaviest prefix among them: %v", reason, shed, attacker[0].shed || attacker[1].shed)
	}
	for i := range 20 {
		admit(t, b, fmt.Sprintf("10.0.%d.%d", i%2, 100+i))
		if worker.shed {
			t.Fatalf("attacker's newcomer %d shed the worker", i)
		}
	}
	if b.Pending() != 8 {
		t.Fatalf("pending %d, want the share of 8", b.Pending())
	}
}

// Sessions past the handshake keep their share: established tickets
// leave the unauthenticated count, a full total sheds a pending one, and
// only a total of established sessions refuses.
func TestBudgetKeepsTheEstablishedShare(t *testing.T) {
	b := NewBudget(4, 2, 2)
	for i := range 3 {
		h, _ := admit(t, b, fmt.Sprintf("192.0.%d.1", i))
		h.t.Established()
	}
	if b.Pending() != 0 || b.InUse() != 3 {
		t.Fatalf("pending %d, in use %d", b.Pending(), b.InUse())
	}
	idle, _ := admit(t, b, "198.51.100.1")
	// The total is full: the next newcomer sheds the one pending socket.
	next, reason := admit(t, b, "203.0.113.1")
	if reason != ReasonTotal || !idle.shed {
		t.Fatalf("full total: reason %q, pending socket shed %v", reason, idle.shed)
	}
	// A socket being authenticated is not shed: with it pending, a
	// full total of others refuses.
	next.t.Authenticating()
	if _, reason, ok := b.Admit("203.0.113.2", func() { t.Fatal("shed an authenticating socket") }); ok || reason != ReasonTotal {
		t.Fatalf("admitted (%v, %q) with every place past or in authentication", ok, reason)
	}
	if !idle.t.WasShed() || next.t.WasShed() {
		t.Fatal("WasShed wrong")
	}
	if release, ok := b.TakeEstablished(); ok {
		release()
		t.Fatal("a cache session took a place beyond the total")
	}
	next.t.Release()
	release, ok := b.TakeEstablished()
	if !ok {
		t.Fatal("a freed place was not taken")
	}
	release()
	release()
	if b.InUse() != 3 {
		t.Fatalf("in use %d after a double release", b.InUse())
	}
}

func TestBudgetShedOldest(t *testing.T) {
	b := NewBudget(8, 4, 4)
	if b.ShedOldest() {
		t.Fatal("shed with nothing pending")
	}
	a, _ := admit(t, b, "192.0.2.1")
	c, _ := admit(t, b, "192.0.2.2")
	if !b.ShedOldest() || !a.shed || c.shed || b.Pending() != 1 {
		t.Fatal("ShedOldest did not close exactly the oldest")
	}
}

// The nil ticket (a session admitted by its caller) ignores everything.
func TestNilTicket(t *testing.T) {
	var tk *Ticket
	tk.Authenticating()
	tk.Established()
	tk.Release()
	if tk.WasShed() {
		t.Fatal("nil ticket shed")
	}
}

func BenchmarkBudgetAdmitRelease(b *testing.B) {
	budget := NewBudget(256, 128, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t, _, _ := budget.Admit("192.0.2.1", func() {})
		t.Established()
		t.Release()
	}
}
