package gctune

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestApplyUnlessTheOperatorChose(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))

	restore := Apply(func(string) string { return "" })
	if got := gcPercent(); got != GCPercent {
		t.Errorf("GOGC = %d after Apply, want %d", got, GCPercent)
	}
	if want := memoryLimit(physicalMemory()); debug.SetMemoryLimit(-1) != want || want <= 0 || want > MaxMemoryLimit {
		t.Errorf("memory limit = %d after Apply, want %d (a quarter of the machine, at most 2 GiB)", debug.SetMemoryLimit(-1), want)
	}
	restore()
	if got := gcPercent(); got != 100 {
		t.Errorf("GOGC = %d after restore, want 100", got)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Errorf("memory limit = %d after restore, want none", got)
	}

	// An operator's GOGC or GOMEMLIMIT wins: nothing changes.
	for _, set := range []string{"GOGC", "GOMEMLIMIT"} {
		restore = Apply(func(k string) string { return map[string]string{set: "50"}[k] })
		if got := gcPercent(); got != 100 {
			t.Errorf("GOGC = %d with %s set, want it left at 100", got, set)
		}
		if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
			t.Errorf("memory limit = %d with %s set, want it left alone", got, set)
		}
		restore()
	}
}

func TestMemoryLimitIsAQuarterUpTo2GiB(t *testing.T) {
	for _, c := range []struct{ physical, want int64 }{
		{0, 0},
		{1 << 30, 256 << 20},
		{4 << 30, 1 << 30},
		{64 << 30, MaxMemoryLimit},
	} {
		if got := memoryLimit(c.physical); got != c.want {
			t.Errorf("memoryLimit(%d) = %d, want %d", c.physical, got, c.want)
		}
	}
}

// gcPercent reads GOGC (SetGCPercent has no read-only form).
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}
