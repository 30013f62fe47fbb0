// Package nixtest gives tests a real Nix with a store of their own and
// flakes in fresh git repositories. Without nix (or git) a test is
// skipped, except under CI, where .ci/run installs them and their absence
// is a failure.
package nixtest

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/nix/narsig"
)

// Require skips (or, under CI, fails) t unless the tools are installed.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed: .ci/run must install it", tool)
			}
			t.Skipf("%s is not installed (.ci/run installs nix-bin and git)", tool)
		}
	}
}

// Config is the Nix configuration of test stores: offline, no sandbox,
// no build users, /bin/sh reachable by builders.
var Config = []string{
	"experimental-features = nix-command flakes",
	"substituters =",
	"flake-registry =",
	"sandbox = false",
	"build-users-group =",
	// A chroot store builds in a namespace: let /bin/sh in.
	"sandbox-paths = /bin /lib /lib64 /usr",
}

// New is a Nix with its own chroot store under a temporary directory.
func New(t testing.TB) *nix.Nix {
	t.Helper()
	Require(t, "nix", "nix-store", "git")
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	n := &nix.Nix{
		Store:  filepath.Join(dir, "store"),
		Config: Config,
		Env: []string{
			"NIX_CONF_DIR=" + filepath.Join(dir, "etc"), // no /etc/nix/nix.conf
			"NIX_USER_CONF_FILES=",
			"HOME=" + filepath.Join(dir, "home"),
			"XDG_CACHE_HOME=" + filepath.Join(dir, "cache"),
			"GIT_CONFIG_NOSYSTEM=1",
		},
		WorkDir: dir,
		Logger:  slog.New(slog.DiscardHandler),
	}
	// Create the store now: Nix 2.8 commands racing to create a fresh
	// store's directories fail ("creating symlink … File exists").
	cmd := exec.Command("nix", "--store", n.Store, "store", "ping")
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), n.Env...), "NIX_CONFIG="+strings.Join(Config, "\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("creating the test store: %v: %s", err, out)
	}
	t.Cleanup(func() { n.Close() }) // its nix-daemon children
	return n
}

// Trusting is New whose imports trust the binary-cache keys (NAME:base64,
// as a cache's PublicKey): a worker on it pulls the input-addressed paths
// those caches signed, as gradient-worker --trusted-public-keys does.
func Trusting(t testing.TB, keys ...string) *nix.Nix {
	t.Helper()
	n := New(t)
	trusted, err := narsig.ParseKeys(strings.Join(keys, " "))
	if err != nil {
		t.Fatal(err)
	}
	n.TrustedKeys = trusted
	return n
}

// Repo commits files (name → content) into a fresh git repository and
// returns its directory and the commit.
func Repo(t testing.TB, files map[string]string) (dir, commit string) {
	t.Helper()
	Require(t, "git")
	dir = t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	Git(t, dir, "init", "--quiet")
	Git(t, dir, "add", ".")
	Git(t, dir, "commit", "--quiet", "-m", "flake")
	return dir, Git(t, dir, "rev-parse", "HEAD")
}

// Git runs git in dir with a fixed identity and returns its trimmed
// output.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=test", "-c", "user.email=test@example.com"}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Lock writes flake.lock for the flake in the repository dir (its inputs
// must be reachable now), commits it and returns the new commit.
func Lock(t testing.TB, dir string) (commit string) {
	t.Helper()
	n := New(t)
	cmd := exec.Command("nix", "--store", n.Store, "flake", "lock", "path:"+dir)
	cmd.Dir = n.WorkDir
	cmd.Env = append(append(os.Environ(), n.Env...), "NIX_CONFIG="+strings.Join(Config, "\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nix flake lock %s: %v: %s", dir, err, out)
	}
	Git(t, dir, "add", "flake.lock")
	Git(t, dir, "commit", "--quiet", "-m", "lock")
	return Git(t, dir, "rev-parse", "HEAD")
}
