package workersession

import (
	"testing"
	"time"
)

func TestBackoffDoublesToMaxAndResets(t *testing.T) {
	t.Parallel()
	b := newBackoff(time.Second, 60*time.Second)
	var got []time.Duration
	for range 8 {
		got = append(got, b.delay())
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("delays %v, want %v seconds", got, want)
		}
	}
	b.reset()
	if d := b.delay(); d != time.Second {
		t.Fatalf("after a served session: %v, want 1s", d)
	}
}

func TestJitterStaysWithinAFifthBelow(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	for range 200 {
		d := Jitter(10 * time.Second)
		if d < 8*time.Second || d > 10*time.Second {
			t.Fatalf("Jitter(10s) = %v, want within [8s, 10s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Fatalf("jitter gave %d distinct delays in 200 draws; workers would still arrive together", len(seen))
	}
}
