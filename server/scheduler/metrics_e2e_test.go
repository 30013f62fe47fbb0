package scheduler_test

import (
	"io"
	"net/http"
	"path"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// TestMetricsOverARealJob: two workers share the server's registry (as in
// gradient up), a real evaluation and build run, Nix's way of fetching a
// NAR from the HTTP cache runs, and one scrape of /metrics then answers
// the operator's questions: how long jobs took by outcome, how long they
// waited for a worker, how long handshakes and token checks took, how
// many NAR bytes moved and how fast; with the Go runtime's series beside.
func TestMetricsOverARealJob(t *testing.T) {
	for engine, dbURL := range map[string]func(testing.TB) string{"sqlite": storagetest.SQLiteURL, "postgres": storagetest.PostgresURL} {
		t.Run(engine, func(t *testing.T) {
			w := newWorld(t, dbURL(t), 2)
			ev, builds := w.waitDone(w.evaluate("packages.x86_64-linux.greeting").ID)
			if ev.Status != storage.EvaluationSucceeded || len(builds) != 1 || len(builds[0].OutputInfo) != 1 {
				t.Fatalf("evaluation %s (%s), builds %+v", ev.Status, ev.Error, builds)
			}
			downloadNar(t, w.httpURL+"/cache/"+w.cache.Name, builds[0].OutputInfo[0].StorePath)

			m := testworld.Scrape(t, w.httpURL+"/metrics")
			for _, h := range []struct {
				name   string
				labels map[string]string
			}{
				{"gradient_worker_job_duration_seconds", map[string]string{"kind": "flake", "outcome": "completed"}},
				{"gradient_worker_job_duration_seconds", map[string]string{"kind": "build", "outcome": "completed"}},
				{"gradient_scheduler_ready_to_assign_seconds", map[string]string{"kind": "flake"}},
				{"gradient_scheduler_ready_to_assign_seconds", map[string]string{"kind": "build"}},
				{"gradient_scheduler_claim_seconds", nil},
				{"gradient_server_handshake_duration_seconds", map[string]string{"outcome": "accepted"}},
				{"gradient_secret_argon2id_verification_duration_seconds", nil},
				{"gradient_worker_nar_transfer_duration_seconds", map[string]string{"direction": "upload"}},
				{"gradient_worker_nar_transfer_size_bytes", map[string]string{"direction": "upload"}},
				{"gradient_cache_nar_download_duration_seconds", map[string]string{"cache": w.cache.Name}},
				{"gradient_cache_nar_download_size_bytes", map[string]string{"cache": w.cache.Name}},
			} {
				if n := m.HistogramCount(h.name, h.labels); n == 0 {
					t.Errorf("histogram %s %v has no observations", h.name, h.labels)
				}
			}
			// Two workers, each with its own series in the one registry.
			if f := m["gradient_worker_sessions_total"]; f == nil || len(f.GetMetric()) != 2 {
				t.Errorf("gradient_worker_sessions_total: %v, want one series per worker", f)
			}
			if got := m.Value("gradient_server_handshakes_total", map[string]string{"outcome": "accepted"}); got < 2 {
				t.Errorf("accepted handshakes %v, want at least the two workers'", got)
			}
			if got := m.Value("gradient_secret_argon2id_verifications_total", map[string]string{"result": "match"}); got < 2 {
				t.Errorf("matched argon2id checks %v, want one per worker token", got)
			}
			if got := m.Value("gradient_scheduler_jobs_pending", nil); got != 0 {
				t.Errorf("jobs pending after the evaluation: %v", got)
			}
			for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
				if m[name] == nil {
					t.Errorf("/metrics lacks %s", name)
				}
			}
			// Nothing waits, and both workers ask for builds: idle capacity.
			deadline := time.Now().Add(30 * time.Second)
			for {
				m := testworld.Scrape(t, w.httpURL+"/metrics")
				idle := m.Value("gradient_scheduler_sessions_idle", map[string]string{"kind": "build"})
				if idle == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("gradient_scheduler_sessions_idle{kind=build} is %v, want both workers", idle)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// downloadNar fetches storePath's narinfo and NAR from the HTTP binary
// cache at cacheURL, as Nix does.
func downloadNar(t *testing.T, cacheURL, storePath string) {
	t.Helper()
	get := func(url string) string {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
		}
		return string(body)
	}
	hash, _, _ := strings.Cut(path.Base(storePath), "-")
	for line := range strings.Lines(get(cacheURL + "/" + hash + ".narinfo")) {
		if url, ok := strings.CutPrefix(strings.TrimSpace(line), "URL: "); ok {
			if len(get(cacheURL+"/"+url)) == 0 {
				t.Fatalf("the NAR of %s is empty", storePath)
			}
			return
		}
	}
	t.Fatalf("the narinfo of %s has no URL", storePath)
}
