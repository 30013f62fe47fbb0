package nix

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// gitRepo commits files into a fresh repository and returns it and the
// commit; prepare, when set, changes the checkout for a second commit.
func gitRepo(t *testing.T, files map[string]string, prepare func(dir string)) (dir, commit string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("git is not installed: .ci/run must install it")
		}
		t.Skip("git is not installed")
	}
	dir = t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=test", "-c", "user.email=test@example.com"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	git("init", "--quiet")
	git("add", ".")
	git("commit", "--quiet", "-m", "one")
	if prepare != nil {
		prepare(dir)
		git("add", ".")
		git("commit", "--quiet", "-m", "two")
	}
	return dir, trimNewline(git("rev-parse", "HEAD"))
}

// A flake's locked inputs are named without fetching them: a store that
// holds only the source (and cannot reach the inputs' repositories) lists
// them, and evaluates once they are copied in.
func TestLockedInputPathsWithoutFetching(t *testing.T) {
	fetcher := newTestNix(t)
	ctx := testContext(t)
	lib, _ := gitRepo(t, map[string]string{"flake.nix": `{ outputs = { self }: { lib.word = "from-input"; }; }`}, nil)
	app, commit := gitRepo(t, map[string]string{"flake.nix": `{
  inputs.lib.url = "git+file://` + lib + `";
  outputs = { self, lib }: {
    packages.x86_64-linux.app = builtins.derivation {
      name = "app"; system = "x86_64-linux"; builder = "/bin/sh"; args = [ "-c" "echo ${lib.lib.word} > $out" ];
    };
  };
}`}, func(dir string) {
		if _, err := fetcher.output(ctx, "nix", "flake", "lock", "path:"+dir); err != nil {
			t.Fatal(err)
		}
	})
	fetched, err := fetcher.FetchFlake(ctx, app, commit, FetchOptions{AllowLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(fetched.InputPaths) != 1 {
		t.Fatalf("fetched inputs %v, want the one input", fetched.InputPaths)
	}

	// Another store gets the source alone; the input's repository is gone.
	cache := "file://" + t.TempDir()
	if err := fetcher.CopyTo(ctx, cache, fetched.SourcePath, fetched.InputPaths[0]); err != nil {
		t.Fatal(err)
	}
	evaluator := newTestNix(t)
	if err := evaluator.CopyFrom(ctx, cache, nil, fetched.SourcePath); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(lib); err != nil {
		t.Fatal(err)
	}
	ref := "path:" + fetched.SourcePath
	inputs, err := evaluator.LockedInputPaths(ctx, ref)
	if err != nil || !slices.Equal(inputs, fetched.InputPaths) {
		t.Fatalf("locked inputs %v, %v; want %v", inputs, err, fetched.InputPaths)
	}
	if valid, _ := evaluator.ValidPaths(ctx, inputs...); len(valid) != 0 {
		t.Fatalf("listing the inputs fetched them: %v", valid)
	}
	if _, err := evaluator.Instantiate(ctx, ref, "packages.x86_64-linux.app"); err == nil {
		t.Fatalf("evaluating without the input: %v, want a failure to fetch it", err)
	}
	if err := evaluator.CopyFrom(ctx, cache, nil, inputs...); err != nil {
		t.Fatal(err)
	}
	if _, err := evaluator.Instantiate(ctx, ref, "packages.x86_64-linux.app"); err != nil {
		t.Fatalf("evaluating with the input copied in: %v", err)
	}
}
