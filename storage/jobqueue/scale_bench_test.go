package jobqueue

import (
	"fmt"
	"os"
	"testing"

	"gradient.dev/gradient/storage"
)

// BenchmarkClaimCompleteQueued measures one ClaimJob +
// CompleteBuildDeferEnd (what the scheduler runs) with many builds queued
// beside it: the cost per assignment must not
// grow with the queue (issue 21). Each op takes the next of the queued
// builds; the queue is b.N plus the size named. Sizes above 4,000 run
// only with GRADIENT_BENCH_SCALE=1 (setup takes long).
func BenchmarkClaimCompleteQueued(b *testing.B) {
	sizes := []int{4000}
	if os.Getenv("GRADIENT_BENCH_SCALE") == "1" {
		sizes = append(sizes, 50_000)
	}
	for _, e := range benchEngines {
		for _, size := range sizes {
			b.Run(fmt.Sprintf("%s/queued=%d", e.name, size), func(b *testing.B) {
				db := openTestDB(b, e.url(b))
				jobs := benchBuildJobs(b, db, b.N+size)
				if db.Engine() == storage.EnginePostgres {
					if _, err := db.sql.ExecContext(b.Context(), `ANALYZE`); err != nil {
						b.Fatal(err)
					}
				}
				worker := storage.NewID()
				outputs := []storage.BuildOutputInfo{{Name: "out", StorePath: "/nix/store/x-out", NarSize: 1, NarHash: "sha256:x"}}
				b.ReportAllocs()
				b.ResetTimer()
				for _, job := range jobs[:b.N] {
					a, err := db.ClaimJob(b.Context(), job, worker)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := db.CompleteBuildDeferEnd(b.Context(), a, outputs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
