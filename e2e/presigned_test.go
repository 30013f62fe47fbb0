package e2e

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
)

// presignedFlake: big copies a 3 MiB incompressible blob from the
// flake's source (so the blob, the source and big's output are all above
// the server's 2 MiB multipart threshold); use, which only the other
// worker can build, reads big. Each needs a feature only one worker has,
// so use's worker must pull big, and the worker that did not evaluate
// must pull its .drv files (under 1 KiB).
const presignedFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: features: script: builtins.derivation {
      inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; requiredSystemFeatures = features;
    };
  in {
    packages.${system} = rec {
      big = step "presigned-big" [ "bigbox" ] "/bin/cp ${./blob} $out";
      use = step "presigned-use" [ "usebox" ] "/usr/bin/wc -c < ${big} > $out";
      small = step "presigned-small" [ ] "echo small > $out";
    };
  };
}
`

const blobSize = 3 << 20

// histogramAtMost counts the observations of histogram name (series
// whose labels include labels) at most bound, bound being one of its
// bucket bounds.
func histogramAtMost(m testworld.Metrics, name string, labels map[string]string, bound float64) uint64 {
	var n uint64
	for _, s := range m[name].GetMetric() {
		match := 0
		for _, l := range s.GetLabel() {
			if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match != len(labels) {
			continue
		}
		for _, b := range s.GetHistogram().GetBucket() {
			if b.GetUpperBound() == bound {
				n += b.GetCumulativeCount()
			}
		}
	}
	return n
}

var metricsURL = regexp.MustCompile(`url=(http://\S+/metrics)`)

// workerMetrics scrapes a gradient-worker started with --metrics-addr.
func workerMetrics(t *testing.T, w *proxyworld.Worker) testworld.Metrics {
	t.Helper()
	var url string
	waitfor.True(t, w.Name+" serving metrics", func() bool {
		for _, l := range w.Lines(`msg="serving metrics"`) {
			if m := metricsURL.FindStringSubmatch(l); m != nil {
				url = m[1]
				return true
			}
		}
		return false
	})
	return testworld.Scrape(t, url)
}

// NARs in S3 end to end (issue 31): a gradient-server on a real versitygw,
// two gradient-workers with real Nix behind a gradient-proxy. Every
// upload goes to a presigned URL (the large ones multipart), every pull
// (big by the other worker, the .drv files too) is a presigned GET, the
// proxy carries no NAR byte either way, and nix copy follows the HTTP
// cache's redirect.
func TestPresignedTransfersBypassTheProxy(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	t.Parallel()
	s3 := s3test.Start(t)
	blob := make([]byte, blobSize)
	rand.Read(blob)
	repo, _ := nixtest.Repo(t, map[string]string{"flake.nix": presignedFlake, "blob": string(blob)})
	commit := nixtest.Git(t, repo, "rev-parse", "HEAD")

	server := proxyworld.StartServer(t, "server", proxyworld.ServerOptions{
		Args: []string{"--allow-local-repositories", "--nar-store", "s3", "--s3-endpoint", s3.Endpoint, "--s3-bucket", s3.Bucket,
			"--s3-region", s3.Region, "--s3-path-style", "--nar-multipart-threshold", strconv.Itoa(2 << 20)},
		Env: []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey},
	})
	project := server.FlakeProject(t, "team", "app", repo, "packages.x86_64-linux.*")
	key := strings.TrimSpace(server.CLI(t, "cache", "public-key", "app-cache"))
	proxyID, peers := server.Register(t, project)

	proxy := proxyworld.StartProxy(t, "proxy", proxyworld.ProxyOptions{})
	proxy.CLI(t, "tenant", "create", "tenant")
	peersFile := filepath.Join(t.TempDir(), "peers")
	if err := os.WriteFile(peersFile, []byte(peers+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	proxy.CLI(t, "link", "set", "tenant", "--url", server.ProtoURL, "--worker-id", proxyID, "--peers-file", peersFile)
	f := &federation{proxy: proxy}
	worker := func(name, feature string) *proxyworld.Worker {
		w := f.createWorker(t, "tenant", name)
		n := nixtest.New(t)
		conf := append([]string{"store = " + n.Store, "system-features = " + feature}, nixtest.Config...)
		env := append(slices.Clone(n.Env), "NIX_CONFIG="+strings.Join(conf, "\n"), "GRADIENT_WORKER_TRUSTED_PUBLIC_KEYS="+key)
		return proxyworld.StartWorker(t, name, proxyworld.WorkerOptions{ServerURL: proxy.ProtoURL, ID: w.ID, Peers: w.ID + ":" + w.Token,
			Features: []string{feature}, Args: []string{"--allow-local-repositories", "--log-level", "info", "--metrics-addr", "127.0.0.1:0"}, Env: env})
	}
	bigWorker, useWorker := worker("worker-big", "bigbox"), worker("worker-use", "usebox")
	waitfor.Within(t, time.Minute, "the pool live on the server", func() bool {
		w := listed(t, server, project, proxyID)
		return w.Live && w.Host != nil && w.Host.MaxConcurrentBuilds == 2
	})

	builds := succeeded(t, server, waitEval(t, server, startEval(t, server, project, commit), "ends", terminal), "big", "use", "small")
	if by := builtBy(builds["big"], bigWorker, useWorker); !slices.Equal(by, []string{"worker-big"}) {
		t.Fatalf("big built by %v", by)
	}
	if by := builtBy(builds["use"], bigWorker, useWorker); !slices.Equal(by, []string{"worker-use"}) {
		t.Fatalf("use built by %v", by)
	}

	// The bytes went between the workers and the object store.
	bm, um := workerMetrics(t, bigWorker), workerMetrics(t, useWorker)
	if n := bm.Value("gradient_worker_presigned_requests_total", map[string]string{"op": "part", "outcome": "ok"}); n < 1 {
		t.Errorf("worker-big sent %v multipart parts, want big's output over the threshold as one at least", n)
	}
	if n := bm.Value("gradient_worker_presigned_bytes_total", map[string]string{"direction": "upload"}); n < blobSize {
		t.Errorf("worker-big uploaded %v bytes to presigned URLs, want big's %d at least", n, blobSize)
	}
	if n := um.Value("gradient_worker_presigned_bytes_total", map[string]string{"direction": "download"}); n < blobSize {
		t.Errorf("worker-use downloaded %v bytes from presigned URLs, want big's %d at least", n, blobSize)
	}
	var smallPulls uint64
	for _, m := range []testworld.Metrics{bm, um} {
		for _, dir := range []string{"upload", "download"} {
			if n := m.Value("gradient_worker_nar_bytes_total", map[string]string{"direction": dir}); n != 0 {
				t.Errorf("a worker moved %v %s bytes over its session", n, dir)
			}
		}
		smallPulls += histogramAtMost(m, "gradient_worker_nar_transfer_size_bytes", map[string]string{"direction": "download"}, 1<<20)
	}
	// Nothing was pulled over a session, so these were presigned GETs.
	if smallPulls == 0 {
		t.Errorf("no worker pulled an object under 1 MiB (a .drv), want the builder that did not evaluate to")
	}
	for _, w := range []*proxyworld.Worker{bigWorker, useWorker} {
		if lines := w.Lines("X-Amz-Signature"); len(lines) > 0 {
			t.Errorf("%s logged a presigned URL's signature: %q", w.Name, lines[0])
		}
	}
	// The proxy carried no NAR byte, in either direction.
	pm := proxy.Metrics(t)
	for _, dir := range []string{"upload", "download"} {
		if n := pm.Value("gradient_proxy_hub_nar_bytes_total", map[string]string{"direction": dir}); n != 0 {
			t.Errorf("the proxy relayed %v %s bytes", n, dir)
		}
	}
	t.Logf("presigned: worker-big %v parts, %v bytes up; worker-use %v bytes down; %d objects under 1 MiB pulled; proxy relayed %v bytes down, %v up",
		bm.Value("gradient_worker_presigned_requests_total", map[string]string{"op": "part", "outcome": "ok"}),
		bm.Value("gradient_worker_presigned_bytes_total", map[string]string{"direction": "upload"}),
		um.Value("gradient_worker_presigned_bytes_total", map[string]string{"direction": "download"}), smallPulls,
		pm.Value("gradient_proxy_hub_nar_bytes_total", map[string]string{"direction": "download"}),
		pm.Value("gradient_proxy_hub_nar_bytes_total", map[string]string{"direction": "upload"}))
	var objects int
	for _, k := range s3.Keys(t) {
		if strings.HasPrefix(k, "nars/") {
			objects++
		} else {
			t.Errorf("the bucket holds %s outside nars/", k)
		}
	}
	if objects < 4 {
		t.Errorf("the bucket holds %d NARs", objects)
	}

	// A Nix client follows the HTTP cache's redirect into the store.
	client := nixtest.New(t)
	use := builds["use"].Outputs[0].Path
	if err := client.CopyFrom(t.Context(), server.URL+"/cache/app-cache", []string{key}, use); err != nil {
		t.Fatalf("nix copy: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(client.Store, use)); err != nil || strings.TrimSpace(string(got)) != strconv.Itoa(blobSize) {
		t.Fatalf("use holds %q (%v), want %d", got, err, blobSize)
	}
}
