package nix

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// testFlake has derivations built from /bin/sh alone (no nixpkgs).
const testFlake = `{
  outputs = { self }: let
    sys = "x86_64-linux";
    mk = name: script: extra: builtins.derivation ({
      inherit name; system = sys; builder = "/bin/sh"; args = [ "-c" script ];
    } // extra);
  in {
    packages.${sys} = rec {
      hello = mk "hello-1.0" "echo building hello; echo hello > $out" {};
      greet = mk "greet" "echo greeting; echo ${hello} > $out" {};
      broken = mk "broken" "echo about to fail; echo oops-this-fails; exit 3" {};
      sleepy = mk "sleepy" "echo sleeping; /bin/sleep 30; echo done > $out" {};
      kvm = mk "kvm-test-2.1" "exit 1" { requiredSystemFeatures = [ "kvm" "big-parallel" ]; timeout = 7; maxSilent = "5"; preferLocalBuild = true; allowSubstitutes = false; };
      bad = throw "bad attribute";
    };
    checks.${sys}.hello = self.packages.${sys}.hello;
    # Builds the kernel's OOM killer would end: the builder itself (the
    # test kills it from outside its namespace, where it is PID 1), or a
    # child (the shell reports "Killed" and exits 137).
    killed.${sys} = {
      builder = mk "killed-builder" "echo allocating; while true; do /bin/sleep 1; done # oom-target" {};
      child = mk "killed-child" "echo allocating; /bin/sh -c 'kill -9 $$'; exit $?" {};
    };
  };
}
`

// newTestNix gives a test its own chroot store and configuration.
func newTestNix(t *testing.T) *Nix {
	t.Helper()
	for _, tool := range []string{"nix", "nix-store"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed: .ci/run must install nix-bin", tool)
			}
			t.Skipf("%s is not installed (.ci/run installs nix-bin)", tool)
		}
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	n := &Nix{
		Store: filepath.Join(dir, "store"),
		Config: []string{
			"experimental-features = nix-command flakes",
			"substituters =",
			"flake-registry =",
			"sandbox = false",
			"build-users-group =",
			// A chroot store builds in a namespace: let /bin/sh in.
			"sandbox-paths = /bin /lib /lib64 /usr",
		},
		Env: []string{
			"NIX_CONF_DIR=" + filepath.Join(dir, "etc"), // no /etc/nix/nix.conf
			"NIX_USER_CONF_FILES=",
			"HOME=" + filepath.Join(dir, "home"),
			"XDG_CACHE_HOME=" + filepath.Join(dir, "cache"),
			"GIT_CONFIG_NOSYSTEM=1",
		},
		WorkDir: dir,
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// newTestRepo commits testFlake into a fresh git repository and returns
// its directory and commit.
func newTestRepo(t *testing.T) (dir, commit string) {
	t.Helper()
	return gitRepo(t, map[string]string{"flake.nix": testFlake}, nil)
}

func trimNewline(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	return s
}

// fetchedTestFlake fetches the test repository into n's store and returns
// a flake reference to the fetched source.
func fetchedTestFlake(t *testing.T, n *Nix) (flakeRef string, fetched *FetchedFlake) {
	t.Helper()
	dir, commit := newTestRepo(t)
	fetched, err := n.FetchFlake(testContext(t), dir, commit, FetchOptions{AllowLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	return "path:" + fetched.SourcePath, fetched
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
