package server_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
)

// benchEvaluation makes an evaluation with n builds (a few failed) and
// returns its ID and a session cookie of the admin scope.
func benchEvaluation(b *testing.B, db *storage.DB, n int) (evalID, build, job string) {
	b.Helper()
	queue := jobqueue.New(db)
	ctx := context.Background()
	team, err := db.CreateTeam(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	p, err := db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: "big", Repository: "https://example.invalid/big.git", Branch: "main"})
	if err != nil {
		b.Fatal(err)
	}
	ev, err := queue.CreateEvaluation(ctx, storage.NewEvaluation{ProjectID: p.ID, RepositoryURL: p.Repository,
		Commit: strings.Repeat("b", 40), Wildcards: []string{"packages.x86_64-linux.*"}})
	if err != nil {
		b.Fatal(err)
	}
	jobs, err := queue.PendingJobs(ctx)
	if err != nil {
		b.Fatal(err)
	}
	a, err := queue.ClaimJob(ctx, jobs[0].JobID, storage.NewID())
	if err != nil {
		b.Fatal(err)
	}
	drvs := make([]storage.DiscoveredBuild, n)
	for i := range drvs {
		name := fmt.Sprintf("pkg%05d", i)
		hash := fmt.Sprintf("%032d", i)
		drvs[i] = storage.DiscoveredBuild{Attr: "packages.x86_64-linux." + name, DrvPath: "/nix/store/" + hash + "-" + name + ".drv",
			Outputs: []storage.BuildOutputPath{{Name: "out", Path: "/nix/store/" + hash + "-" + name}}, Architecture: "x86_64-linux"}
	}
	for start := 0; start < n; start += 1000 {
		if err := queue.AddDiscoveredDerivations(ctx, ev.ID, drvs[start:min(start+1000, n)]); err != nil {
			b.Fatal(err)
		}
	}
	ready, err := queue.CompleteFlakeJob(ctx, a)
	if err != nil {
		b.Fatal(err)
	}
	pending, err := queue.PendingJobsByID(ctx, ready[:min(len(ready), 10)])
	if err != nil {
		b.Fatal(err)
	}
	for i, j := range pending {
		a, err := queue.ClaimJob(ctx, j.JobID, storage.NewID())
		if err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			build, job = j.BuildID, j.JobID // left building
			continue
		}
		if _, _, err := queue.FailJob(ctx, a, storage.FailurePermanent, "boom", 1); err != nil {
			b.Fatal(err)
		}
	}
	return ev.ID, build, job
}

func benchSession(b *testing.B, db *storage.DB) *http.Cookie {
	id, _, err := db.CreateDashboardSession(context.Background(), storage.ScopeAdmin, "", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	return &http.Cookie{Name: "gradient_session", Value: id}
}

// BenchmarkDashboardEvaluationPage renders pages of an evaluation with
// 20,000 builds: the first page (failed first), one deep in the
// succeeded... queued builds by keyset cursor, and a status filter.
func BenchmarkDashboardEvaluationPage(b *testing.B) {
	for _, engine := range []string{"sqlite", "postgres"} {
		b.Run(engine, func(b *testing.B) {
			url := storagetest.SQLiteURL(b)
			if engine == "postgres" {
				url = storagetest.PostgresURLOrSkip(b)
			}
			db, err := storage.Open(context.Background(), url)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			evalID, _, _ := benchEvaluation(b, db, 20000)
			if engine == "postgres" {
				// As autovacuum would have by now: the planner's
				// statistics of the 20,000 builds just inserted.
				raw, err := sql.Open("pgx", url)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := raw.Exec(`ANALYZE builds`); err != nil {
					b.Fatal(err)
				}
				raw.Close()
			}
			srv := server.New(db, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken), Logger: slog.New(slog.DiscardHandler)})
			defer srv.Close()
			h := srv.Handler()
			cookie := benchSession(b, db)
			// A cursor in the middle of the queued builds.
			page, _, err := jobqueue.New(db).BuildsPage(context.Background(), evalID, storage.BuildQueued, jobqueue.BuildCursor{}, 1000)
			if err != nil {
				b.Fatal(err)
			}
			mid := page[len(page)-1]
			for _, c := range []struct{ name, query string }{
				{"first", ""},
				{"deep", "?after_status=queued&after=" + mid.ID},
				{"failed", "?status=failed"},
			} {
				b.Run(c.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						req := httptest.NewRequest("GET", "/evaluations/"+evalID+c.query, nil)
						req.AddCookie(cookie)
						rec := httptest.NewRecorder()
						h.ServeHTTP(rec, req)
						if rec.Code != 200 || !strings.Contains(rec.Body.String(), "20000 builds") {
							b.Fatalf("%d: %.500s", rec.Code, rec.Body.String())
						}
					}
				})
			}
		})
	}
}

// BenchmarkDashboardLogStream appends b.N lines to a running build's log
// (100 a chunk) while 50 SSE clients watch it, until every client has
// every line: lines/s is lines delivered per second to each client. It
// reports the heap per idle watcher too.
func BenchmarkDashboardLogStream(b *testing.B) {
	const watchers = 50
	db, err := storage.Open(context.Background(), storagetest.SQLiteURL(b))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	_, build, job := benchEvaluation(b, db, 20)
	srv := server.New(db, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken), Logger: slog.New(slog.DiscardHandler)})
	defer srv.Close()
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	cookie := benchSession(b, db)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	open := func() *bufio.Reader {
		req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+"/builds/"+build+"/log/stream", nil)
		req.AddCookie(cookie)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("stream: %v %v", resp, err)
		}
		return bufio.NewReader(resp.Body)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	readers := make([]*bufio.Reader, watchers)
	for i := range readers {
		readers[i] = open()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perWatcher := float64(after.HeapInuse-before.HeapInuse) / watchers

	line := strings.Repeat("x", 60) + "\n"
	chunk := []byte(strings.Repeat(line, 100))
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for got := 0; got < b.N; {
				s, err := r.ReadString('\n')
				if err != nil {
					if err != io.EOF {
						b.Error(err)
					}
					return
				}
				if strings.HasPrefix(s, "data: ") {
					got++
				}
			}
		}()
	}
	start := time.Now()
	for sent := 0; sent < b.N; sent += 100 {
		n := min(100, b.N-sent)
		if err := jobqueue.New(db).AppendJobLog(ctx, job, chunk[:n*len(line)]); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "lines/s/client")
	b.ReportMetric(perWatcher, "heap-B/watcher")
}
