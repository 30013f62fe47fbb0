package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/proxyworld"
)

// readmeFlake builds one package with /bin/sh, offline.
const readmeFlake = `{
  outputs = { self }: {
    packages.x86_64-linux.hello = builtins.derivation {
      name = "readme-hello";
      system = "x86_64-linux";
      builder = "/bin/sh";
      args = [ "-c" "echo hello from the readme > $out" ];
    };
  };
}
`

// The README's "Running the services" recipe as typed there, relative
// paths and all, from a fresh working directory: a server with
// --database ./gradient-data --admin-token-file ./admin-token, the CLI
// reading GRADIENT_ADMIN_TOKEN_FILE=./admin-token, a worker with
// --peers-file ./peers --base-dir ./worker-state; an evaluation of a
// flake runs to success with real Nix. (Issue 26 §8: a relative
// --base-dir once made every fetch fail with "unexpected authority".)
// Where the README's values cannot run here: the server listens on a free
// port, the repository is a local flake (so both sides allow local
// repositories), and the worker builds into a chroot store.
func TestReadmeRecipeWithRelativePaths(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	if runtime.GOARCH != "amd64" {
		t.Skipf("the flake builds x86_64-linux; this machine is %s", runtime.GOARCH)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "admin-token"), []byte("readme-admin-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	repo, commit := nixtest.Repo(t, map[string]string{"flake.nix": readmeFlake})

	server := proxyworld.StartIn(t, dir, "server", "gradient-server", nil,
		"--database", "./gradient-data", "--admin-token-file", "./admin-token",
		"--listen", "127.0.0.1:0", "--allow-local-repositories", "--poll-interval", "0")
	addr := server.ListenAddress(t)
	cli := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, proxyworld.Binary(t, "gradient"), args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GRADIENT_SERVER=http://"+addr, "GRADIENT_ADMIN_TOKEN_FILE=./admin-token")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("gradient %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	cli("team", "create", "ops")
	cli("project", "create", "ops/web", "--repository", repo, "--wildcards", "packages.*.*, checks.x86_64-linux.*")
	cli("cache", "create", "main", "--public")
	cli("project", "subscribe", "ops/web", "main")
	out := cli("worker", "register", "--project", "ops/web")
	workerID := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`).FindString(out)
	peers := regexp.MustCompile(`(?m)^\s*([0-9a-f-]{36}:\S+)$`).FindStringSubmatch(out)
	if workerID == "" || peers == nil {
		t.Fatalf("no worker ID and peers line in:\n%s", out)
	}
	if err := os.WriteFile(filepath.Join(dir, "peers"), []byte(peers[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	n := nixtest.New(t)
	env := append(append([]string{}, n.Env...), "NIX_CONFIG="+strings.Join(append([]string{"store = " + n.Store}, nixtest.Config...), "\n"))
	proxyworld.StartIn(t, dir, "worker", "gradient-worker", env,
		"--server-url", "ws://"+addr+"/proto", "--id", workerID, "--peers-file", "./peers", "--base-dir", "./worker-state",
		"--allow-local-repositories", "--gcroots-dir", "", "--drain-timeout-secs", "2")

	out = cli("eval", "start", "ops/web", "--commit", commit, "--wait", "--wait-interval", "200ms")
	if !strings.Contains(out, "packages.x86_64-linux.hello") || !strings.Contains(out, "succeeded") {
		t.Fatalf("the evaluation:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "worker-state")); err != nil {
		t.Fatalf("the worker's state is not in ./worker-state: %v", err)
	}
}
