package limit

import "testing"

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
