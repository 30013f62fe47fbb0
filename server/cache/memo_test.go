package cache

import (
	"fmt"
	"testing"
)

// A fill that read the database before a deletion must not keep what it
// read: the stamp taken at the miss no longer matches.
func TestCacheMemoFillRacingDelete(t *testing.T) {
	m := newCacheMemo()
	_, stamp, ok := m.narinfo("c", "h")
	if ok {
		t.Fatal("empty memo hit")
	}
	m.forgetNarinfo("c", "h") // the path is deleted while the fill reads it
	m.storeNarinfo("c", "h", []byte("stale"), stamp)
	if body, _, ok := m.narinfo("c", "h"); ok {
		t.Fatalf("kept a narinfo read before its deletion: %q", body)
	}
	_, stamp, _ = m.narinfo("c", "h")
	m.storeNarinfo("c", "h", []byte("fresh"), stamp)
	if body, _, ok := m.narinfo("c", "h"); !ok || string(body) != "fresh" {
		t.Fatalf("memo = %q, %v; want fresh", body, ok)
	}
}

// The memo is bounded: past two generations the oldest narinfos go, but a
// narinfo asked for in the meantime is carried into the current one.
func TestCacheMemoBounded(t *testing.T) {
	m := newCacheMemo()
	fill := func(prefix string, n int) {
		for i := range n {
			h := fmt.Sprintf("%s-%d", prefix, i)
			_, stamp, _ := m.narinfo("c", h)
			m.storeNarinfo("c", h, []byte(h), stamp)
		}
	}
	_, stamp, _ := m.narinfo("c", "hot")
	m.storeNarinfo("c", "hot", []byte("hot"), stamp)
	_, stamp, _ = m.narinfo("c", "cold")
	m.storeNarinfo("c", "cold", []byte("cold"), stamp)
	for round := range 3 {
		fill(fmt.Sprint("round", round), maxMemoNarinfos)
		if _, _, ok := m.narinfo("c", "hot"); !ok {
			t.Fatal("a narinfo asked for every generation was dropped")
		}
	}
	if _, _, ok := m.narinfo("c", "cold"); ok {
		t.Error("a narinfo nobody asked for survived three generations")
	}
	if n := len(m.narinfos) + len(m.older); n > 2*maxMemoNarinfos {
		t.Errorf("memo holds %d narinfos, bound is %d", n, 2*maxMemoNarinfos)
	}
}
