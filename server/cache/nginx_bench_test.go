package cache_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/server"
)

// The binary cache is measured side by side with nginx serving the same
// .nar.zst and .narinfo files from disk, in the same run, so both see the
// same machine load. Needs Debian's nginx (apt-get install nginx-light);
// skipped without it.
//
//	go test -run '^$' -bench 'VsNginx' -count 6 ./server

// nginxMirror serves a copy of what our cache serves, from files.
type nginxMirror struct {
	url string
}

func startNginx(b *testing.B, files map[string][]byte) *nginxMirror {
	b.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, err = os.Stat("/usr/sbin/nginx"); err != nil {
			b.Skip("nginx is not installed (apt-get install nginx-light)")
		}
		bin = "/usr/sbin/nginx"
	}
	dir := b.TempDir()
	// nginx's workers drop root; let them read the temporary tree.
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	root := filepath.Join(dir, "root")
	for name, body := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(path, body, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	conf := fmt.Sprintf(`worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 64; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  types { text/x-nix-narinfo narinfo; application/x-nix-nar zst; }
  client_body_temp_path %[1]s/tmp;
  proxy_temp_path %[1]s/tmp;
  fastcgi_temp_path %[1]s/tmp;
  uwsgi_temp_path %[1]s/tmp;
  scgi_temp_path %[1]s/tmp;
  server { listen %[2]s; root %[3]s; }
}
`, dir, addr, root)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", confPath, "-g", "daemon off;")
	cmd.Stderr = os.Stderr
	// Its own process group, so the cleanup ends the workers too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	url := "http://" + addr
	for start := time.Now(); ; {
		if resp, err := http.Get(url + "/"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Since(start) > 10*time.Second {
			b.Fatalf("nginx did not start; see %s/error.log", dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &nginxMirror{url: url}
}

func fetch(b *testing.B, url string) []byte {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return body
}

// benchCache is our cache with one 16 MiB NAR and nginx serving copies.
func benchCache(b *testing.B) (ourNar, ourInfo, nginxNar, nginxInfo string) {
	// Measure serving, not debug logging into a test buffer.
	e := newCacheEnv(b, server.Config{Logger: slog.New(slog.DiscardHandler)})
	nar := make([]byte, 16<<20)
	rand.Read(nar)
	p := e.putObject(b, "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob", nar)
	hash := strings.TrimPrefix(p.StorePath, "/nix/store/")[:32]
	narPath := "/nar/" + p.ObjectKey + ".nar.zst"
	infoPath := "/" + hash + ".narinfo"
	ourNar, ourInfo = e.url+"/cache/main"+narPath, e.url+"/cache/main"+infoPath
	mirror := startNginx(b, map[string][]byte{narPath: fetch(b, ourNar), infoPath: fetch(b, ourInfo)})
	return ourNar, ourInfo, mirror.url + narPath, mirror.url + infoPath
}

// The load generator runs in a child process (this test binary again,
// see TestBenchClientProcess), so the server under test does not share its
// Go runtime and CPU with the client while nginx runs in its own process.
// The child fetches the two URLs alternately, n times each, and prints the
// summed seconds of each and the body size.
func runBenchClient(b *testing.B, ours, theirs string, n int) (oursSec, theirsSec float64, size int64, oursLat, theirsLat []time.Duration) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchClientProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GRADIENT_BENCH_CLIENT=1",
		"GRADIENT_BENCH_OURS="+ours, "GRADIENT_BENCH_THEIRS="+theirs, fmt.Sprintf("GRADIENT_BENCH_N=%d", n))
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("bench client: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		var o, t int64
		if _, err := fmt.Sscanf(line, "lat %d %d", &o, &t); err == nil {
			oursLat = append(oursLat, time.Duration(o))
			theirsLat = append(theirsLat, time.Duration(t))
			continue
		}
		fmt.Sscanf(line, "total %g %g %d", &oursSec, &theirsSec, &size)
	}
	if size == 0 {
		b.Fatalf("bench client printed no totals:\n%s", out)
	}
	return
}

// TestBenchClientProcess is the child of runBenchClient; it does nothing
// in a normal test run.
func TestBenchClientProcess(t *testing.T) {
	if os.Getenv("GRADIENT_BENCH_CLIENT") == "" {
		t.Skip("only runs as the benchmarks' client process")
	}
	var n int
	fmt.Sscan(os.Getenv("GRADIENT_BENCH_N"), &n)
	ours, theirs := os.Getenv("GRADIENT_BENCH_OURS"), os.Getenv("GRADIENT_BENCH_THEIRS")
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2}}
	buf := make([]byte, 256<<10)
	fetchOnce := func(url string) (time.Duration, int64) {
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
		}
		return time.Since(start), n
	}
	fetchOnce(ours) // warm both connections
	fetchOnce(theirs)
	var oursSum, theirsSum time.Duration
	var size int64
	for i := range n {
		// Alternate who goes first, so neither always follows the other.
		var d1, d2 time.Duration
		var sz int64
		if i%2 == 0 {
			d1, sz = fetchOnce(ours)
			d2, _ = fetchOnce(theirs)
		} else {
			d2, _ = fetchOnce(theirs)
			d1, sz = fetchOnce(ours)
		}
		oursSum += d1
		theirsSum += d2
		size = sz
		fmt.Printf("lat %d %d\n", d1, d2)
	}
	fmt.Printf("total %g %g %d\n", oursSum.Seconds(), theirsSum.Seconds(), size)
}

// BenchmarkNarDownloadVsNginx reports both throughputs and ours/nginx
// (goal ≥ 0.9). Each iteration downloads the NAR once from each.
func BenchmarkNarDownloadVsNginx(b *testing.B) {
	ourURL, _, nginxURL, _ := benchCache(b)
	b.ResetTimer()
	oursSec, theirsSec, size, _, _ := runBenchClient(b, ourURL, nginxURL, b.N)
	mib := float64(b.N) * float64(size) / (1 << 20)
	b.ReportMetric(mib/oursSec, "ours-MiB/s")
	b.ReportMetric(mib/theirsSec, "nginx-MiB/s")
	b.ReportMetric(theirsSec/oursSec, "ours/nginx")
}

// BenchmarkNarinfoVsNginx reports the median narinfo latency of both and
// ours/nginx (goal ≤ 1.5). Each iteration is 64 requests to each,
// interleaved.
func BenchmarkNarinfoVsNginx(b *testing.B) {
	_, ourURL, _, nginxURL := benchCache(b)
	b.ResetTimer()
	_, _, _, ours, theirs := runBenchClient(b, ourURL, nginxURL, 64*b.N)
	p50 := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	o, t := p50(ours), p50(theirs)
	b.ReportMetric(float64(o.Microseconds()), "ours-p50-µs")
	b.ReportMetric(float64(t.Microseconds()), "nginx-p50-µs")
	b.ReportMetric(float64(o)/float64(t), "ours/nginx-p50")
}
