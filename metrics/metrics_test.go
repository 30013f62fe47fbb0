package metrics

import (
	"testing"
)

// A binary's registry carries the runtime and process series operators
// expect from every Go service.
func TestNewRegistryHasRuntimeAndProcessSeries(t *testing.T) {
	families, err := NewRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range families {
		have[f.GetName()] = true
	}
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if !have[name] {
			t.Errorf("registry lacks %s; it has %v", name, have)
		}
	}
}
