package e2e

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/internal/waitfor"
)

// readmeHAProxyConfig is the haproxy.cfg README "Two instances and a
// load balancer" shows: the indented block that starts with "defaults".
func readmeHAProxyConfig(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)with this `haproxy.cfg`.*?\n\n((?:    [^\n]*\n|\n)+?)\n[^ \n]").FindSubmatch(data)
	if m == nil {
		t.Fatal("README has no haproxy.cfg block after \"with this `haproxy.cfg`\"")
	}
	var lines []string
	for _, l := range strings.Split(string(m[1]), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "    "))
	}
	cfg := strings.Join(lines, "\n")
	if !strings.HasPrefix(cfg, "defaults") || !strings.Contains(cfg, "127.0.0.1:3101") || !strings.Contains(cfg, "127.0.0.1:3102") {
		t.Fatalf("README's haproxy.cfg is not the two-instance one this test expects:\n%s", cfg)
	}
	return cfg
}

// freeAddr is a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// README's load balancer configuration for two instances, run by a real
// HAProxy in front of two real instances (their addresses put in place
// of the README's): workers and the CLI through it, an evaluation runs;
// kill -9 of the instance holding the worker's session: HAProxy's health
// check takes it out, the worker gets into the other one through HAProxy
// and the next evaluation runs there.
func TestReadmeSeveralInstancesHAProxy(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git", "haproxy")
	t.Parallel()
	w := newInstancesWorld(t, 2)
	a, b := w.c.Servers[0], w.c.Servers[1]
	front := freeAddr(t)
	cfg := strings.NewReplacer("127.0.0.1:3100", front, "127.0.0.1:3101", strings.TrimPrefix(a.URL, "http://"),
		"127.0.0.1:3102", strings.TrimPrefix(b.URL, "http://")).Replace(readmeHAProxyConfig(t))
	cfgFile := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	_, out := testlog.New(t, "haproxy")
	cmd := exec.Command("haproxy", "-f", cfgFile)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	lb := w.c.Behind("haproxy", front)
	waitfor.Within(t, time.Minute, "HAProxy answering /healthz", func() bool {
		resp, err := http.Get(lb.URL + "/healthz")
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	status := lb.CLI(t, "server", "status")
	for _, s := range w.c.Servers {
		if !strings.Contains(status, "live instance:     "+s.Name) {
			t.Errorf("gradient server status through HAProxy does not list %s:\n%s", s.Name, status)
		}
	}

	worker := w.worker(t, "worker", w.project, lb.ProtoURL, 2)
	on := liveOn(t, lb, w.project, worker)[worker.ID]
	commit, builds := wideCommit(t, w.repo, "haproxy", 5, "0")
	succeeded(t, lb, waitEval(t, lb, startEval(t, lb, w.project, commit), "ends", terminal))

	victim := w.c.Instance(t, on)
	before := len(worker.Lines(`msg="session established"`))
	victim.Kill()
	killed := time.Now()
	waitfor.Within(t, 2*time.Minute, "the worker in a new session through HAProxy", func() bool {
		time.Sleep(200 * time.Millisecond)
		return len(worker.Lines(`msg="session established"`)) > before
	})
	t.Logf("the worker's new session %s after the kill of %s", time.Since(killed).Round(time.Millisecond), on)
	if l := sessions(t, lb, w.project)[worker.ID]; !l.Live || l.Instance == on {
		t.Errorf("after the kill of %s the worker is listed live=%v on %q", on, l.Live, l.Instance)
	}
	commit, builds = wideCommit(t, w.repo, "haproxy-after", 5, "0")
	ev := waitEval(t, lb, startEval(t, lb, w.project, commit), "ends after the kill", terminal)
	succeeded(t, lb, ev)
	w.checkEverywhere(t, ev, builds, "haproxy-after")
}
