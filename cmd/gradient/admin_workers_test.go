package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

// A live worker's host — what its session reported in
// WorkerCapabilities and its heartbeat — is in the admin API's JSON and
// in `gradient worker list` and `worker show`, so an operator sees what
// a proxy's pool adds up to.
func TestWorkerListShowsTheLiveHost(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	s.ok(t, "team", "create", "ops")
	s.ok(t, "project", "create", "ops/web", "--repository", "https://example.invalid/web.git")
	s.ok(t, "cache", "create", "main")
	s.ok(t, "project", "subscribe", "ops/web", "main")
	out := s.ok(t, "worker", "register", "--project", "ops/web")
	line := regexp.MustCompile(`(?m)^  ([0-9a-f-]{36}:\S+)$`).FindStringSubmatch(out)
	id := uuidPattern.FindString(out)
	if line == nil || id == "" {
		t.Fatalf("no worker ID and peers line in:\n%s", out)
	}
	w, err := worker.New(worker.Config{
		ServerURL: "ws" + strings.TrimPrefix(s.url, "http") + "/proto", WorkerID: id, Peers: line[1],
		Capabilities:  wire.GradientCapabilities{Build: true},
		Architectures: []string{"x86_64-linux", "aarch64-linux"}, SystemFeatures: []string{"kvm"}, MaxBuilds: 5, CPUCoreScore: 321,
		Heartbeat: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var workers []struct {
		WorkerID string `json:"worker_id"`
		Live     bool   `json:"live"`
		Host     *struct {
			Architectures       []string `json:"architectures"`
			SystemFeatures      []string `json:"system_features"`
			MaxConcurrentBuilds uint32   `json:"max_concurrent_builds"`
			CPUCount            int      `json:"cpu_count"`
			RAMTotalMB          uint64   `json:"ram_total_mb"`
			CPUCoreScore        uint32   `json:"cpu_core_score"`
			RAMFreeMB           *uint64  `json:"ram_free_mb"`
		} `json:"host"`
	}
	waitfor.True(t, "the worker's host and heartbeat in the admin API", func() bool {
		text := s.ok(t, "worker", "list", "--project", "ops/web", "--json")
		if err := json.Unmarshal([]byte(text), &workers); err != nil {
			t.Fatalf("%v in %q", err, text)
		}
		return len(workers) == 1 && workers[0].Live && workers[0].Host != nil && workers[0].Host.RAMFreeMB != nil
	})
	h := workers[0].Host
	if strings.Join(h.Architectures, ",") != "x86_64-linux,aarch64-linux" || strings.Join(h.SystemFeatures, ",") != "kvm" ||
		h.MaxConcurrentBuilds != 5 || h.CPUCount != runtime.NumCPU() || h.RAMTotalMB == 0 || h.CPUCoreScore != 321 {
		t.Errorf("host %+v, want what the worker sent", *h)
	}

	list := s.ok(t, "worker", "list", "--project", "ops/web")
	mustContain(t, list, "ARCHITECTURES", "SLOTS")
	if !regexp.MustCompile(`(?m)^` + id + `\s+yes\s+ops/web\s+\S+\s+x86_64-linux,aarch64-linux\s+5\s`).MatchString(list) {
		t.Errorf("the list lacks the worker's architectures and slots:\n%s", list)
	}
	mustContain(t, s.ok(t, "worker", "show", id), "architectures:", "x86_64-linux,aarch64-linux",
		"build slots:", "cpus:", strconv.Itoa(runtime.NumCPU())+" (core score 321)", "MB RAM free")

	cancel()
	<-done
	waitfor.True(t, "the worker offline", func() bool {
		return !strings.Contains(s.ok(t, "worker", "list", "--project", "ops/web"), "x86_64-linux")
	})
}
