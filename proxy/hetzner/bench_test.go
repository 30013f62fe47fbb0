package hetzner

import (
	"fmt"
	"testing"

	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// BenchmarkPassSteadyState is one pass over 20 tenants with 3 VMs each
// that changes nothing: the server list (60 servers, 2 pages), the
// database reads and the per-VM decisions.
func BenchmarkPassSteadyState(b *testing.B) {
	r := newRig(b, sqldbtest.SQLiteURL(b))
	for i := range 20 {
		tn := r.tenant(fmt.Sprintf("t%02d", i))
		r.noWorkers(tn.ID)
		r.demand.set(tn.ID, x86, 6)
	}
	r.pass()
	if n := len(r.cloud.servers); n != 60 {
		b.Fatalf("%d servers, want 60", n)
	}
	creates := r.cloud.count("POST /servers")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := r.rec.Pass(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if r.cloud.count("POST /servers") != creates {
		b.Fatal("a steady-state pass created servers")
	}
}
