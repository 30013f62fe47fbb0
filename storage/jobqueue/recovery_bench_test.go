package jobqueue

import (
	"testing"
	"time"

	"gradient.dev/gradient/storage"
)

// BenchmarkClaimInstanceIndex measures what the index of open
// assignments by instance (migration 0021) costs the hot loop: one
// ClaimJob (which now records the instance and adds an entry to the
// index) and CompleteBuild (which closes it), with the index and with it
// dropped, side by side in one run (benchstat -col /index).
func BenchmarkClaimInstanceIndex(b *testing.B) {
	for _, e := range benchEngines {
		for _, index := range []string{"kept", "dropped"} {
			b.Run(e.name+"/index="+index, func(b *testing.B) {
				db := openTestDB(b, e.url(b))
				if index == "dropped" {
					if _, err := db.sql.ExecContext(b.Context(), `DROP INDEX job_assignments_open_by_instance`); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := db.RegisterInstance(b.Context(), storage.ServerInstance{ID: "bench", Host: "bench"}, time.Hour, false); err != nil {
					b.Fatal(err)
				}
				q := &testDB{New(db.DB, ForInstance("bench")), db.DB}
				jobs := benchBuildJobs(b, q, b.N)
				worker := storage.NewID()
				outputs := []storage.BuildOutputInfo{{Name: "out", StorePath: "/nix/store/x-out", NarSize: 1, NarHash: "sha256:x"}}
				b.ResetTimer()
				for _, job := range jobs {
					a, err := q.ClaimJob(b.Context(), job, worker)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := q.CompleteBuild(b.Context(), a, outputs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
