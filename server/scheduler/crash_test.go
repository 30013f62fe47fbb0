package scheduler_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
)

// Crash tests: the server or a worker is killed with SIGKILL mid-build,
// as a machine dying would; nothing queued may be lost and nothing may be
// left running forever.

// crashFlake's builds take a few seconds each, so a kill lands mid-build.
const crashFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation {
      inherit name system; builder = "/bin/sh"; args = [ "-c" script ];
    };
    slowly = "i=0; while [ $i -lt 3 ]; do echo tick $i; /bin/sleep 1; i=$((i+1)); done; ";
  in {
    packages.${system} = rec {
      base = step "base" "${slowly} echo base > $out";
      left = step "left" "${slowly} read v < ${base}; echo \"$v left\" > $out";
      right = step "right" "${slowly} read v < ${base}; echo \"$v right\" > $out";
      top = step "top" "read a < ${left}; read b < ${right}; echo \"$a $b\" > $out";
    };
  };
}
`

var (
	binariesOnce sync.Once
	binariesDir  string
	binariesErr  error
)

// binary builds the gradient-server or gradient-worker command once per
// test run.
func binary(t *testing.T, name string) string {
	t.Helper()
	binariesOnce.Do(func() {
		binariesDir, binariesErr = os.MkdirTemp("", "gradient-crash-bin-")
		if binariesErr != nil {
			return
		}
		for _, cmd := range []string{"gradient-server", "gradient-worker"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(binariesDir, cmd), "gradient.dev/gradient/cmd/"+cmd).CombinedOutput()
			if err != nil {
				binariesErr = fmt.Errorf("go build %s: %v: %s", cmd, err, out)
				return
			}
		}
	})
	if binariesErr != nil {
		t.Fatal(binariesErr)
	}
	return filepath.Join(binariesDir, name)
}

// process is a command under test whose output is kept for failures.
type process struct {
	cmd *exec.Cmd
	out *bytes.Buffer
	mu  *sync.Mutex
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func start(t *testing.T, env []string, name string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(binary(t, name), args...), out: &bytes.Buffer{}, mu: &sync.Mutex{}}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = lockedWriter{p.mu, p.out}
	p.cmd.Stderr = lockedWriter{p.mu, p.out}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s output:\n%s", name, p.out.String())
			p.mu.Unlock()
		}
	})
	return p
}

// kill is SIGKILL: no cleanup, no goodbye.
func (p *process) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitHealthy(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("server at %s never became healthy", addr)
}

// crashWorld is a project on a database that a server process serves.
func crashWorld(t *testing.T, dbURL string) *world {
	t.Helper()
	w := &world{t: t, db: testworld.Open(t, dbURL), metrics: prometheus.NewRegistry()} // the workers' series
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": crashFlake})
	w.project, w.cache = testworld.Project(t, w.db, w.repo)
	return w
}

// createEvaluation queues an evaluation in the database, as another
// process (the CLI through the API) would; the server's next pass finds it.
func (w *world) createEvaluation(wildcards ...string) storage.Evaluation {
	w.t.Helper()
	ev, err := jobqueue.New(w.db).CreateEvaluation(w.t.Context(), storage.NewEvaluation{ProjectID: w.project.ID, RepositoryURL: w.repo, Commit: w.commit, Wildcards: wildcards})
	if err != nil {
		w.t.Fatal(err)
	}
	return ev
}

func anyBuilding(_ storage.Evaluation, builds []storage.Build) bool {
	for _, b := range builds {
		if b.Status == storage.BuildBuilding {
			return true
		}
	}
	return false
}

// TestServerKilledWhileBuilding: kill -9 of the server while builds run;
// after the restart every interrupted and queued job completes, and no
// build or assignment is left open.
func TestServerKilledWhileBuilding(t *testing.T) {
	nixtest.Require(t, "nix", "git")
	dbURL := storagetest.PostgresURL(t)
	w := crashWorld(t, dbURL)
	addr := freeAddr(t)
	w.url = "ws://" + addr + "/proto"
	serverArgs := []string{"--listen", addr, "--database", dbURL, "--nar-dir", t.TempDir(), "--poll-interval", "0", "--log-level", "info"}
	srv := start(t, nil, "gradient-server", serverArgs...)
	waitHealthy(t, addr)
	w.startWorker()
	w.startWorker()

	ev := w.createEvaluation("packages.x86_64-linux.*")
	w.waitFor(ev.ID, "a build running", 2*time.Minute, anyBuilding)
	srv.kill()
	time.Sleep(300 * time.Millisecond)
	start(t, nil, "gradient-server", serverArgs...)
	waitHealthy(t, addr)

	ev, builds := w.waitDone(ev.ID)
	if ev.Status != storage.EvaluationSucceeded {
		t.Fatalf("evaluation after the server was killed: %s (%s)", ev.Status, ev.Error)
	}
	if len(builds) != 4 {
		t.Fatalf("%d builds, want 4", len(builds))
	}
	for _, b := range builds {
		if b.Status != storage.BuildSucceeded {
			t.Errorf("build %s: %s", b.Attr, b.Status)
		}
	}
	open, err := jobqueue.New(w.db).OpenAssignments(t.Context())
	if err != nil || len(open) != 0 {
		t.Errorf("open assignments after the evaluation ended: %+v, %v", open, err)
	}
}

// TestWorkerKilledMidBuild: kill -9 of a worker process mid-build; its job
// is queued again and another worker completes it.
func TestWorkerKilledMidBuild(t *testing.T) {
	nixtest.Require(t, "nix", "git")
	w := newWorld(t, storagetest.SQLiteURL(t), 0)
	// The evaluation shares the project of newWorld's flake; give it the
	// crash flake's repository instead.
	w.repo, w.commit = nixtest.Repo(t, map[string]string{"flake.nix": crashFlake})

	id, peers := testworld.Register(t, w.db, w.project.ID)
	n := nixtest.New(t)
	env := append(n.Env, "NIX_CONFIG="+strings.Join(append(nixtest.Config, "store = "+n.Store), "\n"))
	victim := start(t, env, "gradient-worker", "--server-url", w.url, "--peers", peers,
		"--base-dir", t.TempDir(), "--id", id, "--trusted-public-keys", w.cache.PublicKey(),
		"--capabilities-fetch", "--capabilities-eval", "--capabilities-build",
		"--allow-local-repositories") // the world's repository is local

	ev := w.evaluate("packages.x86_64-linux.base")
	_, builds := w.waitFor(ev.ID, "base building on the victim", 2*time.Minute, anyBuilding)
	if builds[0].WorkerID != id {
		t.Fatalf("base runs on %s, want the victim %s", builds[0].WorkerID, id)
	}
	victim.kill()
	survivor := w.startWorker()

	ev, builds = w.waitDone(ev.ID)
	if ev.Status != storage.EvaluationSucceeded || builds[0].Status != storage.BuildSucceeded {
		t.Fatalf("evaluation %s, base %s (%s) after the worker was killed", ev.Status, builds[0].Status, builds[0].Error)
	}
	if builds[0].WorkerID != survivor {
		t.Errorf("base finished on %s, want the surviving worker %s", builds[0].WorkerID, survivor)
	}
}
