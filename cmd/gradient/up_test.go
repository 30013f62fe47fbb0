package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"gradient.dev/gradient/examples"
)

// upRequireNix skips a test without nix and git, unless CI is set.
func upRequireNix(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"nix", "nix-store", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed: .ci/run must install it", tool)
			}
			t.Skipf("%s is not installed (scripts/up installs nix-bin and git)", tool)
		}
	}
}

// upInProcess runs gradient up in-process with a chroot store of its own and
// returns the exit code, stdout, stderr and the store directory.
func upInProcess(t *testing.T, args ...string) (code int, stdout, stderr, store string) {
	t.Helper()
	store = filepath.Join(t.TempDir(), "store")
	var out, errOut bytes.Buffer
	full := append([]string{"--data-dir", filepath.Join(t.TempDir(), "data"), "--store", store,
		"--workers", "2", "--timeout", "55s"}, args...)
	code = runUpContext(t.Context(), full, &out, &errOut)
	t.Logf("gradient up %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(full, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String(), store
}

// upSummaryRow finds the table row of an attribute: status, output.
func upSummaryRow(stdout, attr string) (status, output string, ok bool) {
	for _, line := range strings.Split(stdout, "\n") {
		f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
		if len(f) == 5 && f[0] == attr {
			return f[1], f[4], true
		}
	}
	return "", "", false
}

func upSystemOf(t *testing.T, stdout string) string {
	t.Helper()
	m := regexp.MustCompile(`packages\.([a-z0-9_]+-[a-z]+)\.`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no packages.<system>. attribute in the summary:\n%s", stdout)
	}
	return m[1]
}

// TestUpExampleFlake builds the shipped example flake with two workers
// through the real server, scheduler and protocol.
func TestUpExampleFlake(t *testing.T) {
	upRequireNix(t)
	code, stdout, stderr, store := upInProcess(t)
	if code != exitOK {
		t.Fatalf("exit %d, want 0", code)
	}
	system := upSystemOf(t, stdout)
	for _, attr := range examples.FlakeAttrs {
		full := "packages." + system + "." + attr
		status, output, ok := upSummaryRow(stdout, full)
		if !ok || status != "succeeded" || !strings.HasPrefix(output, "/nix/store/") {
			t.Errorf("%s: row (%q, %q, %v), want succeeded with an output path", full, status, output, ok)
			continue
		}
		if _, err := os.Stat(filepath.Join(store, output)); err != nil {
			t.Errorf("%s: output not in the chroot store: %v", full, err)
		}
	}
	if !strings.Contains(stderr, "evaluation succeeded") || !strings.Contains(stderr, "all 5 builds succeeded") {
		t.Errorf("stderr lacks the progress and the verdict")
	}
	if strings.Contains(stderr, "level=WARN") || strings.Contains(stderr, "level=ERROR") {
		t.Errorf("a clean run logged warnings or errors")
	}
}

const upFailingFlake = `{
  outputs = { self }:
    let
      forAllSystems = f: builtins.listToAttrs (map (system: { name = system; value = f system; })
        [ "x86_64-linux" "aarch64-linux" ]);
      sh = system: name: script: builtins.derivation {
        inherit name system; builder = "/bin/sh"; args = [ "-c" script ];
      };
    in {
      packages = forAllSystems (system: rec {
        fine = sh system "fine" "echo fine > $out";
        broken = sh system "broken" "echo about to fail; echo oops-this-fails; exit 1";
        after = sh system "after" "read x < ${broken}; echo $x > $out";
      });
    };
}
`

// TestUpFailingFlake: a failing build makes the exit code non-zero, is
// named with the end of its log, and its dependent is not built.
func TestUpFailingFlake(t *testing.T) {
	upRequireNix(t)
	repo := t.TempDir()
	if _, err := upCommitFiles(t.Context(), repo, map[string][]byte{"flake.nix": []byte(upFailingFlake)}); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr, _ := upInProcess(t, repo)
	if code == exitOK {
		t.Fatal("exit 0, want a failure")
	}
	system := upSystemOf(t, stdout)
	attr := func(name string) string { return "packages." + system + "." + name }
	if status, output, _ := upSummaryRow(stdout, attr("fine")); status != "succeeded" || !strings.HasPrefix(output, "/nix/store/") {
		t.Errorf("fine: %q %q, want succeeded", status, output)
	}
	if status, output, _ := upSummaryRow(stdout, attr("broken")); status != "failed" || output != "-" {
		t.Errorf("broken: %q %q, want failed without output", status, output)
	}
	if status, output, _ := upSummaryRow(stdout, attr("after")); status != "dependency failed" || output != "-" {
		t.Errorf("after: %q %q, want dependency failed", status, output)
	}
	for _, want := range []string{"FAILED " + attr("broken"), "| oops-this-fails", "NOT BUILT " + attr("after") + " (dependency failed)", "2 of 3 builds did not succeed"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
}

func TestUpUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-h"}, exitOK, "-workers"},
		{[]string{"-h"}, exitOK, "-wildcards"},
		{[]string{"a", "b"}, exitUsage, "one FLAKE at most"},
		{[]string{"--workers", "0"}, exitUsage, "--workers must be at least 1"},
		{[]string{"--timeout", "0s"}, exitUsage, "--timeout must be positive"},
		{[]string{"--wildcards", "nixpkgs.*"}, exitUsage, "--wildcards: pattern \"nixpkgs.*\" must start with one of"},
		{[]string{"--wildcards", "packages.*,"}, exitUsage, "--wildcards: empty pattern"},
	} {
		var out, errOut bytes.Buffer
		code := runUpContext(t.Context(), c.args, &out, &errOut)
		if code != c.code || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("up %v: exit %d, stderr %q; want %d and %q", c.args, code, errOut.String(), c.code, c.want)
		}
	}
}

func TestUpFlakeArgumentAfterFlags(t *testing.T) {
	o, _, ok := parseUp([]string{"--workers", "3", "./repo", "--serve"}, &bytes.Buffer{})
	if !ok || o.flake != "./repo" || o.workers != 3 || !o.serve {
		t.Errorf("parsed %+v, %v", o, ok)
	}
}

func TestUpHoldBuildsAndProfileFlags(t *testing.T) {
	o, _, ok := parseUp([]string{"--hold-builds", "--cpu-profile", "cpu.out", "./repo"}, &bytes.Buffer{})
	if !ok || !o.holdBuilds || o.cpuProfile != "cpu.out" {
		t.Errorf("parsed %+v, %v", o, ok)
	}
	o, _, ok = parseUp([]string{"./repo"}, &bytes.Buffer{})
	if !ok || o.holdBuilds || o.cpuProfile != "" {
		t.Errorf("defaults parsed as %+v, %v", o, ok)
	}
}

func TestProjectName(t *testing.T) {
	for in, want := range map[string]string{
		"example":                             "example",
		"/home/me/src/my-flake/":              "my-flake",
		"https://example.com/team/web.git":    "web",
		"git@example.com:team/_odd name!.git": "oddname",
		"///":                                 "flake",
	} {
		if got := upProjectName(in); got != want {
			t.Errorf("upProjectName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCommitFilesCommitsOnlyChanges(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	dir := t.TempDir()
	files := map[string][]byte{"flake.nix": examples.FlakeNix}
	first, err := upCommitFiles(t.Context(), dir, files)
	if err != nil {
		t.Fatal(err)
	}
	again, err := upCommitFiles(t.Context(), dir, files)
	if err != nil || again != first {
		t.Errorf("unchanged files: commit %s (%v), want %s", again, err, first)
	}
	files["flake.nix"] = append([]byte("# changed\n"), examples.FlakeNix...)
	changed, err := upCommitFiles(t.Context(), dir, files)
	if err != nil || changed == first || len(changed) != 40 {
		t.Errorf("changed files: commit %s (%v), want a new one", changed, err)
	}
}

const upEvalErrorFlake = `{
  outputs = { self }:
    let
      forAllSystems = f: builtins.listToAttrs (map (system: { name = system; value = f system; })
        [ "x86_64-linux" "aarch64-linux" ]);
    in {
      packages = forAllSystems (system: {
        good = builtins.derivation { name = "good"; inherit system; builder = "/bin/sh"; args = [ "-c" "echo good > $out" ]; };
        bad = builtins.throw "deliberately-broken-attribute";
      });
    };
}
`

// TestUpEvaluationError: an attribute that fails to evaluate fails the
// run although everything that evaluated was built.
func TestUpEvaluationError(t *testing.T) {
	upRequireNix(t)
	repo := t.TempDir()
	if _, err := upCommitFiles(t.Context(), repo, map[string][]byte{"flake.nix": []byte(upEvalErrorFlake)}); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr, _ := upInProcess(t, repo)
	if code == exitOK {
		t.Fatal("exit 0, want a failure")
	}
	system := upSystemOf(t, stdout)
	if status, _, _ := upSummaryRow(stdout, "packages."+system+".good"); status != "succeeded" {
		t.Errorf("good: %q, want succeeded", status)
	}
	if !strings.Contains(stderr, "deliberately-broken-attribute") || !strings.Contains(stderr, "the evaluation reported 1 errors") {
		t.Errorf("stderr does not name the evaluation error")
	}
}

// TestUpAgainUsesTheCache: a second run over the same data directory finds
// every output in the cache and builds nothing, and says so.
func TestUpAgainUsesTheCache(t *testing.T) {
	upRequireNix(t)
	data := filepath.Join(t.TempDir(), "data")
	run := func() (int, string, string) {
		var out, errOut bytes.Buffer
		args := []string{"--data-dir", data, "--store", filepath.Join(t.TempDir(), "store"), "--workers", "1", "--timeout", "55s"}
		code := runUpContext(t.Context(), args, &out, &errOut)
		t.Logf("gradient up: exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
		return code, out.String(), errOut.String()
	}
	if code, _, _ := run(); code != exitOK {
		t.Fatalf("first run: exit %d", code)
	}
	code, stdout, stderr := run()
	if code != exitOK {
		t.Fatalf("second run: exit %d, want 0", code)
	}
	system := upSystemOf(t, stdout)
	for _, attr := range examples.FlakeAttrs {
		if status, output, ok := upSummaryRow(stdout, "packages."+system+"."+attr); !ok || status != "cached" || !strings.HasPrefix(output, "/nix/store/") {
			t.Errorf("%s: row (%q, %q, %v), want cached with its output path", attr, status, output, ok)
		}
	}
	if !strings.Contains(stderr, "already in the cache: not built") || strings.Contains(stderr, "succeeded on") ||
		!strings.Contains(stderr, "all 5 builds succeeded (5 of them already in the cache)") {
		t.Errorf("the progress does not say the builds were cached, or says they ran")
	}
}

const upChecksFlake = `{
  outputs = { self }:
    let
      forAllSystems = f: builtins.listToAttrs (map (system: { name = system; value = f system; })
        [ "x86_64-linux" "aarch64-linux" ]);
      sh = system: name: script: builtins.derivation {
        inherit name system; builder = "/bin/sh"; args = [ "-c" script ];
      };
    in {
      packages = forAllSystems (system: { app = sh system "app" "echo app > $out"; });
      checks = forAllSystems (system: {
        unit = sh system "unit" "echo the-unit-check-ran; echo ok > $out";
        broken = sh system "broken" "exit 1";
      });
    };
}
`

// TestUpWildcards: --wildcards chooses what the project builds, checks
// here (with an exclusion); a later run without it builds packages again.
func TestUpWildcards(t *testing.T) {
	upRequireNix(t)
	system := map[string]string{"amd64": "x86_64-linux", "arm64": "aarch64-linux"}[runtime.GOARCH]
	if system == "" {
		t.Skipf("the test flake has no systems for %s", runtime.GOARCH)
	}
	repo := t.TempDir()
	if _, err := upCommitFiles(t.Context(), repo, map[string][]byte{"flake.nix": []byte(upChecksFlake)}); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(t.TempDir(), "data")
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		full := append([]string{"--data-dir", data, "--store", filepath.Join(t.TempDir(), "store"), "--workers", "1", "--timeout", "55s"}, args...)
		code := runUpContext(t.Context(), append(full, repo), &out, &errOut)
		t.Logf("gradient up %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(full, " "), code, out.String(), errOut.String())
		return code, out.String(), errOut.String()
	}
	attr := func(output, name string) string { return output + "." + system + "." + name }

	code, stdout, stderr := run("--wildcards", "checks."+system+".*, !"+attr("checks", "broken"))
	if code != exitOK {
		t.Fatalf("exit %d, want 0", code)
	}
	if status, output, ok := upSummaryRow(stdout, attr("checks", "unit")); !ok || status != "succeeded" || !strings.HasPrefix(output, "/nix/store/") {
		t.Errorf("checks.unit: row (%q, %q, %v), want succeeded", status, output, ok)
	}
	for _, other := range []string{attr("checks", "broken"), attr("packages", "app")} {
		if _, _, ok := upSummaryRow(stdout, other); ok {
			t.Errorf("%s was built although the wildcards do not select it", other)
		}
	}
	if !strings.Contains(stderr, "evaluation of checks."+system+".*, !"+attr("checks", "broken")+" queued") ||
		!strings.Contains(stderr, "all 1 builds succeeded") {
		t.Errorf("stderr does not name the wildcards or the verdict")
	}

	// Without --wildcards the project goes back to packages.<system>.*.
	code, stdout, _ = run()
	if code != exitOK {
		t.Fatalf("second run: exit %d, want 0", code)
	}
	if status, _, ok := upSummaryRow(stdout, attr("packages", "app")); !ok || status != "succeeded" {
		t.Errorf("packages.app: row (%q, %v), want succeeded", status, ok)
	}
	if _, _, ok := upSummaryRow(stdout, attr("checks", "unit")); ok {
		t.Error("checks were built again without --wildcards")
	}
}
