package jobqueue

import (
	"fmt"
	"testing"

	"gradient.dev/gradient/storage"
)

// BenchmarkAddDiscoveredDerivations records an evaluation's EvalResults
// as the scheduler does: batches of 50 derivations (one op), each with
// an edge to the one before it, on SQLite.
func BenchmarkAddDiscoveredDerivations(b *testing.B) {
	ctx := b.Context()
	db := openTestDB(b, freshSQLiteURL(b))
	e, _ := benchEvaluationClaimed(b, db)
	const perBatch = 50
	batches := make([][]storage.DiscoveredBuild, b.N)
	for n := range batches {
		for i := n * perBatch; i < (n+1)*perBatch; i++ {
			d := storage.DiscoveredBuild{
				Attr: fmt.Sprintf("packages.x86_64-linux.p%d", i), DrvPath: fmt.Sprintf("/nix/store/%032d-p.drv", i),
				Outputs:      []storage.BuildOutputPath{{Name: "out", Path: fmt.Sprintf("/nix/store/%032d-p", i)}},
				Architecture: "x86_64-linux",
			}
			if i > 0 {
				d.Dependencies = []string{fmt.Sprintf("/nix/store/%032d-p.drv", i-1)}
			}
			batches[n] = append(batches[n], d)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		if err := db.AddDiscoveredDerivations(ctx, e.ID, batches[n]); err != nil {
			b.Fatal(err)
		}
	}
}
