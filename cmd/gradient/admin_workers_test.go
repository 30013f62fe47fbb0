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
	"gradient.dev/gradient/workersession"
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
		Session: workersession.Config{
			ServerURL: "ws" + strings.TrimPrefix(s.url, "http") + "/proto", WorkerID: id, Peers: line[1],
			Capabilities: wire.GradientCapabilities{Build: true},
			Heartbeat:    20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		},
		Architectures: []string{"x86_64-linux", "aarch64-linux"}, SystemFeatures: []string{"kvm"}, MaxBuilds: 5, CPUCoreScore: 321,
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

// A worker that went away with a reason and came back shows live with no
// offline reason: the old one is of the past (issue 26 §8). Both ways
// back: the operator fixes what refused it, and a plain reconnect.
func TestWorkerListDropsThePastReasonOnceLive(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	s.ok(t, "team", "create", "ops")
	s.ok(t, "project", "create", "ops/web", "--repository", "https://example.invalid/web.git")
	out := s.ok(t, "worker", "register", "--project", "ops/web")
	line := regexp.MustCompile(`(?m)^  ([0-9a-f-]{36}:\S+)$`).FindStringSubmatch(out)
	id := uuidPattern.FindString(out)
	if line == nil || id == "" {
		t.Fatalf("no worker ID and peers line in:\n%s", out)
	}
	run := func() (stop func()) {
		w, err := worker.New(worker.Config{
			Session: workersession.Config{
				ServerURL: "ws" + strings.TrimPrefix(s.url, "http") + "/proto", WorkerID: id, Peers: line[1],
				Capabilities: wire.GradientCapabilities{Build: true}, Logger: slog.New(slog.DiscardHandler),
				BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); w.Run(ctx) }()
		stop = func() { cancel(); <-done }
		t.Cleanup(stop)
		return stop
	}
	row := func() string {
		for l := range strings.Lines(s.ok(t, "worker", "list", "--project", "ops/web")) {
			if strings.HasPrefix(l, id) {
				return strings.TrimSpace(l)
			}
		}
		t.Fatal("the worker is not listed")
		return ""
	}
	live := regexp.MustCompile(`^` + id + `\s+yes\s`)
	liveWithoutReason := func(past string) {
		t.Helper()
		waitfor.True(t, "the worker live", func() bool { return live.MatchString(row()) })
		if r := row(); strings.Contains(r, past) || !strings.HasSuffix(r, " -") {
			t.Fatalf("a live worker listed with the reason of its last disconnect:\n%s", r)
		}
		if shown := s.ok(t, "worker", "show", id); strings.Contains(shown, "offline") {
			t.Fatalf("worker show of a live worker names an offline reason:\n%s", shown)
		}
	}

	// Refused until the project has a cache; the worker retries.
	stop := run()
	waitfor.True(t, "the worker refused for want of a cache", func() bool { return strings.Contains(row(), "no cache subscribed") })
	s.ok(t, "cache", "create", "main")
	s.ok(t, "project", "subscribe", "ops/web", "main")
	liveWithoutReason("no cache subscribed")

	stop()
	waitfor.True(t, "the worker offline with its reason", func() bool { return strings.Contains(row(), "worker stopping") })
	run()
	liveWithoutReason("worker stopping")
}
