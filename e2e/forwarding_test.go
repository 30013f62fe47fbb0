package e2e

import (
	"bytes"
	"errors"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/waitfor"
)

// forwardFlake is a tenant's flake: base ← left, right ← top (a chain
// with parallel leaves), and gated, another leaf that adds a line to
// GATE/started and runs until GATE/release exists, so a test can act while
// it builds. TAG makes each tenant's derivations its own.
const forwardFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
  in {
    packages.${system} = rec {
      base = step "TAG-base" "echo TAG > $out";
      left = step "TAG-left" "read v < ${base}; echo \"$v left\" > $out";
      right = step "TAG-right" "read v < ${base}; echo \"$v right\" > $out";
      top = step "TAG-top" "read a < ${left}; read b < ${right}; echo \"$a $b\" > $out";
      gated = step "TAG-gated" "read v < ${base}; echo started >> GATE/started; while [ ! -e GATE/release ]; do /bin/sleep 0.2; done; echo \"$v gated\" > $out";
    };
  };
}
`

// tenantFlake is one tenant's repository and the gates of its rounds.
type tenantFlake struct {
	tag  string
	repo string
	// gates is the directory the tenant's workers let their builders
	// write to (sandbox-paths); each round's gate is a directory in it.
	gates string
	// key is the public key of the tenant's cache, which its workers
	// trust (--trusted-public-keys): they pull each other's outputs.
	key string
}

func newTenantFlake(t *testing.T, tag string) *tenantFlake {
	tf := &tenantFlake{tag: tag, gates: t.TempDir()}
	tf.repo, _ = nixtest.Repo(t, map[string]string{"README": tag})
	return tf
}

// round commits the flake with the round's gate and returns the commit
// and the gate directory.
func (tf *tenantFlake) round(t *testing.T, name string) (commit, gate string) {
	t.Helper()
	gate = filepath.Join(tf.gates, name)
	if err := os.MkdirAll(gate, 0o755); err != nil {
		t.Fatal(err)
	}
	flake := strings.NewReplacer("TAG", tf.tag, "GATE", gate).Replace(forwardFlake)
	if err := os.WriteFile(filepath.Join(tf.repo, "flake.nix"), []byte(flake), 0o644); err != nil {
		t.Fatal(err)
	}
	nixtest.Git(t, tf.repo, "add", "flake.nix")
	nixtest.Git(t, tf.repo, "commit", "--quiet", "-m", name)
	return nixtest.Git(t, tf.repo, "rev-parse", "HEAD"), gate
}

// started is how many times a gated build began behind gate.
func started(t *testing.T, gate string) int {
	t.Helper()
	// One line per start: a PID would not do, each sandbox has its own
	// PID namespace.
	data, err := os.ReadFile(filepath.Join(gate, "started"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(data, []byte("\n"))
}

func release(t *testing.T, gate string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(gate, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// evalView and buildView are the server's admin API answers, as far as
// the tests read them.
type evalView struct {
	ID       string      `json:"id"`
	Status   string      `json:"status"`
	Terminal bool        `json:"terminal"`
	Error    string      `json:"error"`
	Builds   []buildView `json:"builds"`
}

type buildView struct {
	ID       string `json:"id"`
	Attr     string `json:"attr"`
	Status   string `json:"status"`
	WorkerID string `json:"worker_id"`
	Attempts int    `json:"attempts"`
	Error    string `json:"error"`
	Outputs  []struct {
		Name string `json:"name"`
		Path string `json:"path"`
	} `json:"outputs"`
}

// leaf is the last part of a build's attribute path.
func (b buildView) leaf() string { return b.Attr[strings.LastIndex(b.Attr, ".")+1:] }

func startEval(t *testing.T, s *proxyworld.Server, project, commit string) string {
	t.Helper()
	var ev evalView
	s.API(t, "POST", "/api/v1/projects/"+url.PathEscape(project)+"/evaluations", map[string]any{"commit": commit}, &ev)
	return ev.ID
}

func evaluation(t *testing.T, s *proxyworld.Server, id string) evalView {
	t.Helper()
	var ev evalView
	s.API(t, "GET", "/api/v1/evaluations/"+id, nil, &ev)
	return ev
}

// waitEval waits (generously: real builds on a shared machine) until
// cond holds for the evaluation, asking the server a few times a second.
func waitEval(t *testing.T, s *proxyworld.Server, id, what string, cond func(evalView) bool) evalView {
	t.Helper()
	var ev evalView
	waitfor.Within(t, 4*time.Minute, s.Name+": evaluation "+what, func() bool {
		ev = evaluation(t, s, id)
		if cond(ev) {
			return true
		}
		time.Sleep(200 * time.Millisecond)
		return false
	})
	return ev
}

func terminal(ev evalView) bool { return ev.Terminal }

// succeeded requires the evaluation and every build to have succeeded
// and returns the builds by leaf name.
func succeeded(t *testing.T, s *proxyworld.Server, ev evalView, want ...string) map[string]buildView {
	t.Helper()
	if ev.Status != "succeeded" {
		t.Fatalf("%s: evaluation %s %s (%s), builds %+v", s.Name, ev.ID, ev.Status, ev.Error, ev.Builds)
	}
	builds := map[string]buildView{}
	for _, b := range ev.Builds {
		builds[b.leaf()] = b
		if b.Status != "succeeded" {
			t.Errorf("%s: build %s %s (%s)", s.Name, b.Attr, b.Status, b.Error)
		}
	}
	for _, name := range want {
		if _, ok := builds[name]; !ok {
			t.Errorf("%s: evaluation %s has no build %s: %+v", s.Name, ev.ID, name, ev.Builds)
		}
	}
	return builds
}

// builtBy is which of workers logged building the build ("built"
// build=ID).
func builtBy(b buildView, workers ...*proxyworld.Worker) []string {
	var by []string
	for _, w := range workers {
		if len(w.Lines(`msg=built`, "build="+b.ID)) > 0 {
			by = append(by, w.Name)
		}
	}
	return by
}

var jobAttr = regexp.MustCompile(` job=(\S+)`)

// runningBuilds are the build jobs w accepted and has not ended.
func runningBuilds(w *proxyworld.Worker) []string {
	ended := map[string]bool{}
	for _, msg := range []string{`msg="job completed"`, `msg="job failed"`, `msg="job cancelled`} {
		for _, l := range w.Lines(msg) {
			if m := jobAttr.FindStringSubmatch(l); m != nil {
				ended[m[1]] = true
			}
		}
	}
	var running []string
	for _, l := range w.Lines(`msg="accepted job"`, "kind=build") {
		if m := jobAttr.FindStringSubmatch(l); m != nil && !ended[m[1]] {
			running = append(running, m[1])
		}
	}
	return running
}

// runningOne is the one of workers that runs a build, once its log says
// so (the builder may start before the log line reaches the test).
func runningOne(t *testing.T, workers []*proxyworld.Worker) *proxyworld.Worker {
	t.Helper()
	var running []*proxyworld.Worker
	waitfor.True(t, "exactly one worker running a build", func() bool {
		running = running[:0]
		for _, w := range workers {
			if n := len(runningBuilds(w)); n == 1 {
				running = append(running, w)
			} else if n > 1 {
				t.Fatalf("%s runs %d builds with one slot", w.Name, n)
			}
		}
		return len(running) == 1
	})
	return running[0]
}

// narMagic starts every NAR (its first string, length-prefixed).
var narMagic = []byte("\x0d\x00\x00\x00\x00\x00\x00\x00nix-archive-1")

// zstdMagic starts a zstd frame: compressed NARs as the cache serves them.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// noNAR fails t when a file under dir is a NAR, holds one, or is named
// like one; it returns how many files it read.
func noNAR(t *testing.T, dir string) int {
	t.Helper()
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		// A worker stages pulls as *.nar.zst and uploads as nar-upload-*.zst.
		if name := d.Name(); strings.HasSuffix(name, ".nar") || strings.Contains(name, ".nar.") || strings.HasPrefix(name, "nar-") ||
			strings.HasSuffix(name, ".narinfo") {
			t.Errorf("the proxy holds %s", path)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		if bytes.Contains(data, narMagic) || bytes.Contains(data, []byte("nix-archive-1")) || bytes.HasPrefix(data, zstdMagic) {
			t.Errorf("%s holds a NAR", path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("scanning %s: %v", dir, err)
	}
	return files
}

// nixWorker runs a gradient-worker behind the proxy with a chroot store
// of its own whose builders may write to the tenant's gates, trusting
// the tenant's cache key.
func (f *federation) nixWorker(t *testing.T, name string, w createdWorker, tf *tenantFlake) *proxyworld.Worker {
	t.Helper()
	n := nixtest.New(t)
	conf := []string{"store = " + n.Store}
	for _, line := range nixtest.Config {
		if strings.HasPrefix(line, "sandbox-paths") {
			line += " " + tf.gates
		}
		conf = append(conf, line)
	}
	env := append(slices.Clone(n.Env), "NIX_CONFIG="+strings.Join(conf, "\n"), "GRADIENT_WORKER_TRUSTED_PUBLIC_KEYS="+tf.key)
	return proxyworld.StartWorker(t, name, proxyworld.WorkerOptions{ServerURL: f.proxy.ProtoURL, ID: w.ID, Peers: w.ID + ":" + w.Token,
		Args: []string{"--allow-local-repositories", "--log-level", "info"}, Env: env})
}

// Job forwarding end to end with real processes (issue 18's Tests): two
// tenants' servers, one proxy, two gradient-workers with real Nix behind
// it per tenant, each worker its own chroot store.
func TestJobForwarding(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	t.Parallel()
	flakeA, flakeB := newTenantFlake(t, "alpha"), newTenantFlake(t, "beta")
	proxyTmp := t.TempDir() // the proxy's TMPDIR: where it would stage NARs
	f := newFederationWith(t, federationOptions{
		// A retry at once: the transient failure of subtest 2 would wait
		// the default 30 s.
		ServerArgs: []string{"--allow-local-repositories", "--build-retry-backoff-secs", "0"},
		Project: func(s *proxyworld.Server, team string) string {
			repo := flakeA.repo
			if team == "beta" {
				repo = flakeB.repo
			}
			return s.FlakeProject(t, team, "app", repo, "packages.x86_64-linux.*")
		},
		Proxy: proxyworld.ProxyOptions{Env: []string{"TMPDIR=" + proxyTmp}},
	})
	flakeA.key = strings.TrimSpace(f.serverA.CLI(t, "cache", "public-key", "app-cache"))
	flakeB.key = strings.TrimSpace(f.serverB.CLI(t, "cache", "public-key", "app-cache"))
	workersA := []*proxyworld.Worker{
		f.nixWorker(t, "worker-a1", f.createWorker(t, "tenant-a", "a1"), flakeA),
		f.nixWorker(t, "worker-a2", f.createWorker(t, "tenant-a", "a2"), flakeA),
	}
	workersB := []*proxyworld.Worker{
		f.nixWorker(t, "worker-b1", f.createWorker(t, "tenant-b", "b1"), flakeB),
		f.nixWorker(t, "worker-b2", f.createWorker(t, "tenant-b", "b2"), flakeB),
	}
	// Processes a subtest starts for later ones run under the test.
	test := t
	// Both pools behind the proxy, each server seeing its own two slots.
	waitfor.Within(t, time.Minute, "A's pool live on server A", func() bool {
		w := listed(t, f.serverA, f.projectA, f.proxyIDA)
		return w.Live && w.Host != nil && w.Host.MaxConcurrentBuilds == 2
	})
	waitfor.Within(t, time.Minute, "B's pool live on server B", func() bool {
		w := listed(t, f.serverB, f.projectB, f.proxyIDB)
		return w.Live && w.Host != nil && w.Host.MaxConcurrentBuilds == 2
	})

	t.Run("each tenant's evaluation builds on its own workers, concurrently, into its own cache", func(t *testing.T) {
		commitA, gateA := flakeA.round(t, "r1")
		commitB, gateB := flakeB.round(t, "r1")
		evA, evB := startEval(t, f.serverA, f.projectA, commitA), startEval(t, f.serverB, f.projectB, commitB)
		// Both gated builds run at once before either is let go: the two
		// evaluations are in flight together.
		waitfor.Within(t, 4*time.Minute, "both tenants' gated builds running", func() bool {
			time.Sleep(100 * time.Millisecond)
			return started(t, gateA) > 0 && started(t, gateB) > 0
		})
		release(t, gateA)
		release(t, gateB)
		a := succeeded(t, f.serverA, waitEval(t, f.serverA, evA, "ends", terminal), "base", "left", "right", "top", "gated")
		b := succeeded(t, f.serverB, waitEval(t, f.serverB, evB, "ends", terminal), "base", "left", "right", "top", "gated")

		// Every build ran on exactly one of its tenant's workers, none on
		// the other tenant's; the servers recorded the proxy as the worker.
		for _, tc := range []struct {
			s            *proxyworld.Server
			proxyID      string
			builds       map[string]buildView
			own, foreign []*proxyworld.Worker
		}{{f.serverA, f.proxyIDA, a, workersA, workersB}, {f.serverB, f.proxyIDB, b, workersB, workersA}} {
			used := map[string]bool{}
			for name, build := range tc.builds {
				if build.WorkerID != tc.proxyID {
					t.Errorf("%s: %s recorded on worker %s, want the proxy %s", tc.s.Name, name, build.WorkerID, tc.proxyID)
				}
				by := builtBy(build, tc.own...)
				if len(by) != 1 {
					t.Errorf("%s: %s built by %v of its tenant's workers, want exactly one", tc.s.Name, name, by)
				}
				for _, w := range by {
					used[w] = true
				}
				if by := builtBy(build, tc.foreign...); len(by) > 0 {
					t.Errorf("%s: %s built by the other tenant's %v", tc.s.Name, name, by)
				}
			}
			if len(used) != 2 {
				t.Errorf("%s: builds ran on %v; the gated leaf held one worker, so both must have built", tc.s.Name, used)
			}
		}
		// The flake jobs (fetch and evaluation) too.
		for _, w := range workersA {
			if len(w.Lines(`msg="evaluating flake"`, flakeB.repo)) > 0 {
				t.Errorf("%s evaluated tenant B's flake", w.Name)
			}
		}
		for _, w := range workersB {
			if len(w.Lines(`msg="evaluating flake"`, flakeA.repo)) > 0 {
				t.Errorf("%s evaluated tenant A's flake", w.Name)
			}
		}

		// A real nix copy from each server's cache into a fresh store.
		for _, tc := range []struct {
			s        *proxyworld.Server
			builds   map[string]buildView
			want     string
			other    map[string]buildView
			otherTag string
		}{{f.serverA, a, "alpha left alpha right\n", b, "beta"}, {f.serverB, b, "beta left beta right\n", a, "alpha"}} {
			cacheURL := tc.s.URL + "/cache/app-cache"
			key := strings.TrimSpace(tc.s.CLI(t, "cache", "public-key", "app-cache"))
			top := tc.builds["top"].Outputs[0].Path
			client := nixtest.New(t)
			if err := client.CopyFrom(t.Context(), cacheURL, []string{key}, top, tc.builds["gated"].Outputs[0].Path); err != nil {
				t.Fatalf("%s: nix copy --from %s: %v", tc.s.Name, cacheURL, err)
			}
			if got, err := os.ReadFile(filepath.Join(client.Store, top)); err != nil || string(got) != tc.want {
				t.Errorf("%s: top copied from the cache holds %q (%v), want %q", tc.s.Name, got, err, tc.want)
			}
			// The other tenant's outputs are not in this cache.
			other := tc.other["top"].Outputs[0].Path
			hash := strings.SplitN(strings.TrimPrefix(other, "/nix/store/"), "-", 2)[0]
			resp, err := http.Get(cacheURL + "/" + hash + ".narinfo")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("%s: %s's cache answers %d for %s's output %s", tc.s.Name, tc.s.Name, resp.StatusCode, tc.otherTag, other)
			}
		}

		// Nothing of it stayed on the proxy.
		if n := noNAR(t, f.proxy.DataDir) + noNAR(t, proxyTmp); n == 0 {
			t.Errorf("scanned no file in the proxy's data directory %s: the scan proves nothing", f.proxy.DataDir)
		}
	})

	t.Run("a worker killed mid-build: JobFailed transient, the build completes on the other", func(t *testing.T) {
		commit, gate := flakeA.round(t, "r2") // only gated is new
		ev := startEval(t, f.serverA, f.projectA, commit)
		waitfor.Within(t, 4*time.Minute, "the gated build running", func() bool {
			time.Sleep(100 * time.Millisecond)
			return started(t, gate) > 0
		})
		victim := runningOne(t, workersA)
		survivor := workersA[0]
		if survivor == victim {
			survivor = workersA[1]
		}
		failedBefore := len(f.serverA.Lines(`msg="job failed"`, "kind=Transient", "gated"))
		victim.Kill()
		waitfor.Within(t, time.Minute, "server A recording the gated job failed transient", func() bool {
			return len(f.serverA.Lines(`msg="job failed"`, "kind=Transient", "gated", "requeued=true")) > failedBefore
		})
		// The retry (after the server's retry backoff, 30 s) runs on the
		// survivor: a second start behind the gate, then let it go.
		waitfor.Within(t, 3*time.Minute, "the gated build started again", func() bool {
			time.Sleep(200 * time.Millisecond)
			return started(t, gate) > 1
		})
		release(t, gate)
		builds := succeeded(t, f.serverA, waitEval(t, f.serverA, ev, "ends", terminal), "gated")
		gated := builds["gated"]
		if by := builtBy(gated, workersA...); !slices.Equal(by, []string{survivor.Name}) {
			t.Errorf("gated built by %v, want the survivor %s only", by, survivor.Name)
		}
		if gated.Attempts < 2 {
			t.Errorf("gated: %d attempts, want the lost one and the retry", gated.Attempts)
		}
		// The killed worker's slot is gone from A's aggregate.
		waitfor.True(t, "A's aggregate without the killed worker", func() bool {
			w := listed(t, f.serverA, f.projectA, f.proxyIDA)
			return w.Host != nil && w.Host.MaxConcurrentBuilds == 1
		})
		// Bring the victim back for the next subtest, same worker row.
		for i, w := range workersA {
			if w == victim {
				workersA[i] = f.restartWorker(test, victim, flakeA)
			}
		}
		waitfor.Within(t, time.Minute, "A's pool back to two slots", func() bool {
			w := listed(t, f.serverA, f.projectA, f.proxyIDA)
			return w.Live && w.Host != nil && w.Host.MaxConcurrentBuilds == 2
		})
	})

	t.Run("server A killed: A's workers get AbortJob and Draining, B finishes, A completes after its restart", func(t *testing.T) {
		commitA, gateA := flakeA.round(t, "r3")
		commitB, gateB := flakeB.round(t, "r3")
		evA, evB := startEval(t, f.serverA, f.projectA, commitA), startEval(t, f.serverB, f.projectB, commitB)
		waitfor.Within(t, 4*time.Minute, "both tenants' gated builds running", func() bool {
			time.Sleep(100 * time.Millisecond)
			return started(t, gateA) > 0 && started(t, gateB) > 0
		})
		running := runningOne(t, workersA)
		count := func(ws []*proxyworld.Worker, fragments ...string) []int {
			var n []int
			for _, w := range ws {
				n = append(n, len(w.Lines(fragments...)))
			}
			return n
		}
		drainingB, abortsB := count(workersB, "server is draining"), count(workersB, `msg="aborting job"`)
		drainingA := count(workersA, "server is draining")
		abortsBefore := len(running.Lines(`msg="aborting job"`))

		f.serverA.Kill()
		waitfor.Within(t, time.Minute, "AbortJob at the worker running A's build", func() bool {
			return len(running.Lines(`msg="aborting job"`)) > abortsBefore
		})
		for i, w := range workersA {
			waitfor.Within(t, time.Minute, w.Name+" told A's server is draining", func() bool {
				return len(w.Lines("server is draining")) > drainingA[i]
			})
		}
		// B, meanwhile, is untouched: its gated build runs on; let go, its
		// evaluation finishes while A is down.
		release(t, gateB)
		succeeded(t, f.serverB, waitEval(t, f.serverB, evB, "ends while server A is down", terminal), "gated")
		if !f.serverA.Exited() {
			t.Fatal("server A runs again before its restart")
		}
		if got := count(workersB, "server is draining"); !slices.Equal(got, drainingB) {
			t.Errorf("B's workers were told to drain (%v lines, before %v)", got, drainingB)
		}
		if got := count(workersB, `msg="aborting job"`); !slices.Equal(got, abortsB) {
			t.Errorf("B's workers got AbortJob (%v lines, before %v)", got, abortsB)
		}
		if started(t, gateB) != 1 {
			t.Errorf("B's gated build started %d times, want once", started(t, gateB))
		}

		// A again, same database, NAR directory and address.
		f.serverA.Restart(t)
		waitfor.Within(t, 2*time.Minute, "the proxy live on server A again", func() bool {
			w := listed(t, f.serverA, f.projectA, f.proxyIDA)
			return w.Live && w.Host != nil && w.Host.MaxConcurrentBuilds == 2
		})
		release(t, gateA)
		builds := succeeded(t, f.serverA, waitEval(t, f.serverA, evA, "ends after the restart", terminal), "gated")
		// The aborted run and the one after the restart, which re-queued
		// the job its predecessor had assigned.
		if n := started(t, gateA); n != 2 {
			t.Errorf("A's gated build started %d times, want twice (aborted, then after the restart)", n)
		}
		if len(f.serverA.Lines("recovered interrupted work")) == 0 {
			t.Error("the restarted server A did not re-queue the interrupted job")
		}
		if by := builtBy(builds["gated"], workersA...); len(by) != 1 {
			t.Errorf("A's gated built by %v, want one of A's workers", by)
		}
		if by := builtBy(builds["gated"], workersB...); len(by) > 0 {
			t.Errorf("A's gated built by B's %v", by)
		}
	})
}

// restartWorker starts a worker behind the proxy again under w's ID and
// peers file (a new store: the old one died with it).
func (f *federation) restartWorker(t *testing.T, w *proxyworld.Worker, tf *tenantFlake) *proxyworld.Worker {
	t.Helper()
	peers, err := os.ReadFile(w.PeersFile)
	if err != nil {
		t.Fatal(err)
	}
	id, token, _ := strings.Cut(strings.TrimSpace(string(peers)), ":")
	return f.nixWorker(t, w.Name+"-again", createdWorker{ID: id, Token: token}, tf)
}
