package limit

import "testing"

func TestGlobal(t *testing.T) {
	g := NewGlobal(0)
	r, ok := g.TryAcquire()
	if !ok || g.Capacity() != 1 || g.InUse() != 1 {
		t.Fatal("capacity 0 must admit one")
	}
	if _, ok := g.TryAcquire(); ok {
		t.Fatal("admitted beyond capacity")
	}
	r()
	r()
	if g.InUse() != 0 {
		t.Fatal("release twice freed twice")
	}

	g = NewGlobal(2)
	a, ok1 := g.TryAcquire()
	_, ok2 := g.TryAcquire()
	_, ok3 := g.TryAcquire()
	if !ok1 || !ok2 || ok3 || g.InUse() != 2 {
		t.Fatal("capacity 2")
	}
	a()
	if _, ok := g.TryAcquire(); !ok {
		t.Fatal("a released permit did not reopen a slot")
	}
}

func TestPerIP(t *testing.T) {
	p := NewPerIP(2)
	a, _ := p.TryAcquire("1.1.1.1")
	p.TryAcquire("1.1.1.1")
	if _, ok := p.TryAcquire("1.1.1.1"); ok {
		t.Fatal("third from one IP admitted")
	}
	if _, ok := p.TryAcquire("2.2.2.2"); !ok {
		t.Fatal("another IP refused")
	}
	a()
	if _, ok := p.TryAcquire("1.1.1.1"); !ok {
		t.Fatal("released slot not free")
	}
	if p.Tracked() != 2 {
		t.Fatalf("tracked %d", p.Tracked())
	}
}
