package limit

import (
	"container/list"
	"net/netip"
	"sync"
)

// Budget is the connection budget of an authority's /proto: at most total
// connections, of which at most preAuth have not finished their handshake
// (the rest is kept for sessions past it), and at most perPrefix of those
// from one address prefix (PrefixKey: an IPv4 /24, an IPv6 /64).
//
// Unauthenticated connections are shed rather than new ones refused: when
// a limit is reached, the oldest unauthenticated connection of the
// newcomer's prefix (prefix limit), else of the prefix holding the most
// (handshake and connection limits), is closed to admit the newcomer. So
// sockets held open by a few addresses cannot keep a worker out: its
// connection is the newest, and it is shed only when its own prefix holds
// the most. A connection whose credentials are being checked
// (Ticket.Authenticating) is not shed. Only when every connection is past
// its handshake (or being checked) is a newcomer refused.
type Budget struct {
	total, preAuth, perPrefix int

	mu       sync.Mutex
	inUse    int // tickets not released, pre-auth or established
	pending  int // tickets still before the end of their handshake
	byPrefix map[string]*list.List
}

// NewBudget sizes a budget; each bound is clamped to at least 1, and
// preAuth and perPrefix to at most total.
func NewBudget(total, preAuth, perPrefix int) *Budget {
	total = max(total, 1)
	return &Budget{total: total, preAuth: min(max(preAuth, 1), total), perPrefix: min(max(perPrefix, 1), total),
		byPrefix: map[string]*list.List{}}
}

// Ticket is one admitted connection's share of the budget. Its methods
// are safe for concurrent use and a nil Ticket ignores them all.
type Ticket struct {
	b      *Budget
	prefix string
	shed   func()
	// Guarded by b.mu.
	elem          *list.Element // in b.byPrefix[prefix] while pending
	authenticated bool          // being checked: not shed
	state         ticketState
}

type ticketState uint8

const (
	pending ticketState = iota
	established
	wasShed
	released
)

// Shed reasons, also the refusals' reasons.
const (
	ReasonPrefix     = "address prefix limit"
	ReasonHandshakes = "handshake limit"
	ReasonTotal      = "connection limit"
)

// Admit takes a place for a new unauthenticated connection from addr.
// shed is called (at most once, without the budget's lock held) when the
// connection is shed for a newer one: it must close the connection. When
// admitting it shed another connection, shedReason says which limit was
// reached; ok false (reason set) refuses the newcomer.
func (b *Budget) Admit(addr string, shed func()) (t *Ticket, shedReason string, ok bool) {
	key := PrefixKey(addr)
	b.mu.Lock()
	var victim *Ticket
	reason := ""
	switch {
	case b.queueLen(key) >= b.perPrefix:
		reason = ReasonPrefix
		victim = b.oldest(b.byPrefix[key])
	case b.pending >= b.preAuth:
		reason = ReasonHandshakes
		victim = b.heaviest()
	case b.inUse >= b.total:
		reason = ReasonTotal
		victim = b.heaviest()
	}
	if reason != "" {
		if victim == nil {
			b.mu.Unlock()
			return nil, reason, false
		}
		b.dropPending(victim)
		victim.state = wasShed
		b.inUse--
	}
	t = &Ticket{b: b, prefix: key, shed: shed}
	q := b.byPrefix[key]
	if q == nil {
		q = list.New()
		b.byPrefix[key] = q
	}
	t.elem = q.PushBack(t)
	b.pending++
	b.inUse++
	b.mu.Unlock()
	if victim != nil {
		victim.shed()
	}
	return t, reason, true
}

// TakeEstablished takes a place for a connection that is not shed and
// not counted as unauthenticated (a cache session under its own limits);
// false when the budget is full.
func (b *Budget) TakeEstablished() (release func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inUse >= b.total {
		return nil, false
	}
	b.inUse++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.inUse--
			b.mu.Unlock()
		})
	}, true
}

func (b *Budget) queueLen(key string) int {
	if q := b.byPrefix[key]; q != nil {
		return q.Len()
	}
	return 0
}

// oldest is the first ticket of q that may be shed.
func (b *Budget) oldest(q *list.List) *Ticket {
	if q == nil {
		return nil
	}
	for e := q.Front(); e != nil; e = e.Next() {
		if t := e.Value.(*Ticket); !t.authenticated {
			return t
		}
	}
	return nil
}

// heaviest is the oldest sheddable ticket of the prefix holding the most
// unauthenticated connections. It walks every prefix: only on the rare
// path where a limit is reached, over at most preAuth tickets.
func (b *Budget) heaviest() *Ticket {
	var best *Ticket
	bestLen := 0
	for _, q := range b.byPrefix {
		if q.Len() <= bestLen {
			continue
		}
		if t := b.oldest(q); t != nil {
			best, bestLen = t, q.Len()
		}
	}
	return best
}

// dropPending takes t out of the unauthenticated connections.
func (b *Budget) dropPending(t *Ticket) {
	q := b.byPrefix[t.prefix]
	q.Remove(t.elem)
	if q.Len() == 0 {
		delete(b.byPrefix, t.prefix)
	}
	t.elem = nil
	b.pending--
}

// Authenticating marks the connection's credentials as being checked: it
// is no longer shed, and ends its handshake soon either way.
func (t *Ticket) Authenticating() {
	if t == nil {
		return
	}
	t.b.mu.Lock()
	t.authenticated = true
	t.b.mu.Unlock()
}

// Established moves the connection past its handshake: it keeps its
// place in the total but leaves the unauthenticated share.
func (t *Ticket) Established() {
	if t == nil {
		return
	}
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	if t.state == pending {
		t.b.dropPending(t)
		t.state = established
	}
}

// Release gives the place back; calling it again, or after the
// connection was shed, does nothing.
func (t *Ticket) Release() {
	if t == nil {
		return
	}
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	switch t.state {
	case pending:
		t.b.dropPending(t)
		t.b.inUse--
	case established:
		t.b.inUse--
	default:
		return
	}
	t.state = released
}

// WasShed reports whether the connection was shed for a newer one.
func (t *Ticket) WasShed() bool {
	if t == nil {
		return false
	}
	t.b.mu.Lock()
	defer t.b.mu.Unlock()
	return t.state == wasShed
}

// ShedOldest sheds the oldest unauthenticated connection of the prefix
// holding the most (an HTTP server near its file limit makes room);
// false when there is none to shed.
func (b *Budget) ShedOldest() bool {
	b.mu.Lock()
	victim := b.heaviest()
	if victim != nil {
		b.dropPending(victim)
		victim.state = wasShed
		b.inUse--
	}
	b.mu.Unlock()
	if victim == nil {
		return false
	}
	victim.shed()
	return true
}

// InUse is how many connections hold a place; Pending how many of them
// have not finished their handshake.
func (b *Budget) InUse() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inUse
}

func (b *Budget) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending
}

// Capacity is the total.
func (b *Budget) Capacity() int { return b.total }

// PrefixKey is the unit the per-prefix limit of unauthenticated
// connections counts: the /24 of an IPv4 address, the /64 of an IPv6 one
// (v4-mapped addresses count as IPv4). One attacker commonly holds a few
// neighbouring addresses, so counting single addresses multiplies its
// share. Anything that does not parse counts as itself.
func PrefixKey(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	ip = ip.Unmap().WithZone("")
	bits := 64
	if ip.Is4() {
		bits = 24
	}
	prefix, _ := ip.Prefix(bits)
	return prefix.String()
}
