package nixexec_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/wire"
)

// A server (or proxy) that is malicious or compromised sends a real
// worker flake jobs whose commit or URL would make git run a command or
// read the worker's disk. Each job fails with a reason naming the
// refusal, before the worker reports Fetching, and the command never
// runs.
func TestHostileFlakeSourcesAreRefused(t *testing.T) {
	tw := startServer(t)
	caps := wire.GradientCapabilities{Fetch: true, Eval: true}
	local, _ := tw.startWorker(t, caps, true)
	strict, _ := tw.startWorker(t, caps, false)
	repo, commit := nixtest.Repo(t, map[string]string{"flake.nix": testFlake})
	marker := filepath.Join(t.TempDir(), "injected")
	inject := "--upload-pack=touch " + marker + ";false"

	for i, tc := range []struct {
		worker, url, commit, reason string
	}{
		// The local worker could fetch repo: only the commit stops git.
		{local, repo, inject, "not a full 40- or 64-digit hex object id"},
		{local, inject, commit, "starts with '-'"},
		{local, "-oProxyCommand=touch " + marker, commit, "starts with '-'"},
		{local, "ext::sh -c touch% " + marker, commit, "space or control character"},
		{local, "ext::touch", commit, "remote helper"},
		{local, "fd::0", commit, "remote helper"},
		{strict, "file://" + repo, commit, "local repositories are not allowed"},
		{strict, repo, commit, "local repositories are not allowed"},
	} {
		id := fmt.Sprintf("hostile-%d", i)
		tw.loop.enqueue(tc.worker, &wire.AssignJob{JobID: id, AssignmentID: id + "-a1", Job: &wire.FlakeJob{
			Steps:          []wire.FlakeStep{wire.FlakeStepFetchFlake, wire.FlakeStepEvaluateFlake, wire.FlakeStepEvaluateDerivations},
			Source:         &wire.FlakeSourceRepository{URL: tc.url, Commit: tc.commit},
			Wildcards:      []string{"packages.x86_64-linux.*"},
			InputOverrides: []wire.FlakeInputOverride{},
		}})
		got := tw.loop.wait(t, id, time.Minute)
		if got.failed == nil || got.failed.Kind != wire.FailurePermanent || !strings.Contains(got.failed.Error, tc.reason) {
			t.Errorf("job with url %q commit %q: failed %+v, want a permanent failure saying %q", tc.url, tc.commit, got.failed, tc.reason)
		}
		if len(got.updates) != 0 {
			t.Errorf("job with url %q commit %q reported %v before failing: it ran", tc.url, tc.commit, got.updates)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("job with url %q commit %q: the injected command ran", tc.url, tc.commit)
		}
	}
}
