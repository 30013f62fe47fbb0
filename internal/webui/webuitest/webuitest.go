// Package webuitest starts Debian's chromium for the dashboards' browser
// tests (chromedp) and says where their screenshots go.
package webuitest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
)

// Chromium finds the browser: the test is skipped without it, except in
// CI (CI=true), where .ci/run installs it and its absence fails the test.
func Chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed: .ci/run must install it")
	}
	t.Skip("chromium is not installed (.ci/run installs Debian's chromium)")
	return ""
}

// Artifacts is where screenshots go: $GRADIENT_TEST_ARTIFACTS/<test>,
// else a temporary directory.
func Artifacts(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("GRADIENT_TEST_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	dir = filepath.Join(dir, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Start runs the browser at path headless (no sandbox, GPU, sync or
// background traffic, a fresh profile) with a window of width×height,
// until the test ends, and returns its context.
func Start(t testing.TB, path string, width, height int) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(t.Context(),
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(width, height))
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatal(err)
	}
	return ctx
}
