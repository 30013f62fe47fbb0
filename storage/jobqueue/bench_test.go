package jobqueue

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// benchEngines give each benchmark a fresh database of each engine.
var benchEngines = []struct {
	name string
	url  func(b *testing.B) string
}{
	{"sqlite", func(b *testing.B) string { return "sqlite://" + filepath.Join(b.TempDir(), "gradient.db") }},
	{"postgres", func(b *testing.B) string { return sqldbtest.PostgresURLOrSkip(b) }},
}

// BenchmarkClaimCompleteBuild measures one ClaimJob + CompleteBuild (the
// hot loop of the scheduler) on independent builds of one evaluation:
// serially, and from parallel goroutines (throughput of the whole pool).
func BenchmarkClaimCompleteBuild(b *testing.B) {
	for _, e := range benchEngines {
		for _, parallel := range []bool{false, true} {
			name := e.name + "/serial"
			if parallel {
				name = e.name + "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				db := openTestDB(b, e.url(b))
				jobs := benchBuildJobs(b, db, b.N)
				worker := storage.NewID()
				outputs := []storage.BuildOutputInfo{{Name: "out", StorePath: "/nix/store/x-out", NarSize: 1, NarHash: "sha256:x"}}
				b.ReportAllocs()
				b.ResetTimer()
				if !parallel {
					for _, job := range jobs {
						a, err := db.ClaimJob(b.Context(), job, worker)
						if err != nil {
							b.Fatal(err)
						}
						if _, err := db.CompleteBuild(b.Context(), a, outputs); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				queue := make(chan string, len(jobs))
				for _, j := range jobs {
					queue <- j
				}
				close(queue)
				b.SetParallelism(4)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						job := <-queue
						a, err := db.ClaimJob(b.Context(), job, worker)
						if err != nil {
							b.Error(err)
							return
						}
						if _, err := db.CompleteBuild(b.Context(), a, outputs); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.StopTimer()
				if ev, err := db.Evaluation(b.Context(), benchEvalOf(b, db, jobs)); err != nil || ev.Status != storage.EvaluationSucceeded {
					b.Fatalf("evaluation after the run: %+v, %v", ev, err)
				}
			})
		}
	}
}

// benchEvaluationClaimed makes a team, a project and an evaluation whose
// flake job a worker has claimed, as an evaluation is while its worker
// reports derivations; it returns the evaluation and the assignment.
func benchEvaluationClaimed(b *testing.B, db *testDB) (storage.Evaluation, string) {
	b.Helper()
	ctx := b.Context()
	team, err := db.CreateTeam(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	project, err := db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: "p", Repository: "r", Branch: "main"})
	if err != nil {
		b.Fatal(err)
	}
	e, err := db.CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: project.ID, RepositoryURL: "r", Commit: "c"})
	if err != nil {
		b.Fatal(err)
	}
	pending, err := db.PendingJobs(ctx)
	if err != nil || len(pending) != 1 {
		b.Fatalf("PendingJobs = %d, %v", len(pending), err)
	}
	a, err := db.ClaimJob(ctx, pending[0].JobID, storage.NewID())
	if err != nil {
		b.Fatal(err)
	}
	return e, a
}

// benchBuildJobs makes an evaluation with n independent builds and returns
// their pending jobs.
func benchBuildJobs(b *testing.B, db *testDB, n int) []string {
	b.Helper()
	ctx := b.Context()
	e, a := benchEvaluationClaimed(b, db)
	for start := 0; start < n; start += 1000 {
		var batch []storage.DiscoveredBuild
		for i := start; i < min(start+1000, n); i++ {
			batch = append(batch, storage.DiscoveredBuild{
				Attr: fmt.Sprintf("packages.x86_64-linux.p%d", i), DrvPath: fmt.Sprintf("/nix/store/%08d-p.drv", i),
				Outputs:      []storage.BuildOutputPath{{Name: "out", Path: fmt.Sprintf("/nix/store/%08d-p", i)}},
				Architecture: "x86_64-linux",
			})
		}
		if err := db.AddDiscoveredDerivations(ctx, e.ID, batch); err != nil {
			b.Fatal(err)
		}
	}
	ready, err := db.CompleteFlakeJob(ctx, a)
	if err != nil || len(ready) != n {
		b.Fatalf("CompleteFlakeJob = %d jobs, %v", len(ready), err)
	}
	return ready
}

func benchEvalOf(b *testing.B, db *testDB, jobs []string) string {
	b.Helper()
	list, err := db.ListEvaluations(b.Context(), "", 1)
	if err != nil || len(list) != 1 {
		b.Fatalf("ListEvaluations = %+v, %v", list, err)
	}
	return list[0].ID
}

// BenchmarkFillRequiredPaths reads the required paths of 200 ready builds
// with 20 inputs each, half of them in the project's cache: what offering
// an evaluation's newly ready builds costs.
func BenchmarkFillRequiredPaths(b *testing.B) {
	for _, e := range benchEngines {
		b.Run(e.name, func(b *testing.B) {
			ctx := b.Context()
			db := openTestDB(b, e.url(b))
			team, _ := db.CreateTeam(ctx, "bench")
			project, err := db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: "p", Repository: "r", Branch: "main"})
			if err != nil {
				b.Fatal(err)
			}
			cache, _ := db.CreateCache(ctx, storage.NewCache{Name: "c"})
			if _, err := db.SubscribeProject(ctx, project.ID, cache.ID); err != nil {
				b.Fatal(err)
			}
			ev, err := db.CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: project.ID, RepositoryURL: "r", Commit: "c"})
			if err != nil {
				b.Fatal(err)
			}
			pending, _ := db.PendingJobs(ctx)
			if _, err := db.ClaimJob(ctx, pending[0].JobID, storage.NewID()); err != nil {
				b.Fatal(err)
			}
			out := func(i int) string { return fmt.Sprintf("/nix/store/%032d-lib", i) }
			var libs, drvs []storage.DiscoveredBuild
			var libDrvs []string
			for i := range 20 {
				d := storage.DiscoveredBuild{DrvPath: fmt.Sprintf("/nix/store/%032d-lib.drv", i), Architecture: "x86_64-linux",
					Outputs: []storage.BuildOutputPath{{Name: "out", Path: out(i)}}}
				libs = append(libs, d)
				libDrvs = append(libDrvs, d.DrvPath)
				if i%2 == 0 {
					if _, _, err := db.PutCachePath(ctx, storage.CachePath{CacheID: cache.ID, StorePath: out(i), NarHash: "sha256:0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73",
						NarSize: 2000, FileHash: "sha256:094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic", FileSize: 1000,
						Compression: "zstd", ObjectKey: "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic"}); err != nil {
						b.Fatal(err)
					}
				}
			}
			for i := range 200 {
				drvs = append(drvs, storage.DiscoveredBuild{DrvPath: fmt.Sprintf("/nix/store/%032d-app.drv", i), Architecture: "x86_64-linux",
					Outputs: []storage.BuildOutputPath{{Name: "out", Path: fmt.Sprintf("/nix/store/%032d-app", i)}}, Dependencies: libDrvs})
			}
			if err := db.AddDiscoveredDerivations(ctx, ev.ID, append(libs, drvs...)); err != nil {
				b.Fatal(err)
			}
			builds, err := db.EvaluationBuilds(ctx, ev.ID)
			if err != nil {
				b.Fatal(err)
			}
			if db.Engine() == storage.EnginePostgres {
				// As autovacuum would have by now: plans from real row counts.
				if _, err := db.sql.ExecContext(ctx, `ANALYZE`); err != nil {
					b.Fatal(err)
				}
			}
			var jobs []storage.PendingJob
			for _, bl := range builds {
				if strings.HasSuffix(bl.DrvPath, "-app.drv") {
					jobs = append(jobs, storage.PendingJob{JobID: storage.NewID(), Kind: storage.JobBuild, BuildID: bl.ID, ProjectID: project.ID})
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := db.FillRequiredPaths(ctx, jobs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if len(jobs) != 200 || len(jobs[0].RequiredPaths) != 20 || !jobs[0].RequiredPaths[0].Cached {
				b.Fatalf("%d jobs, the first requires %+v", len(jobs), jobs[0].RequiredPaths)
			}
		})
	}
}
