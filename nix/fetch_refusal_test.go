package nix

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/gitsource"
)

// A fetch refuses what the server (which the worker does not trust) could
// smuggle into git's command line: an option as the commit or the URL, a
// remote helper, a local repository without AllowLocal. Nothing runs:
// the marker a successful injection would create never appears.
func TestFetchFlakeRefusesInjection(t *testing.T) {
	n := newTestNix(t)
	repo, commit := newTestRepo(t)
	marker := filepath.Join(t.TempDir(), "injected")
	inject := "--upload-pack=touch " + marker + ";false"
	for _, tc := range []struct {
		name, url, commit string
		allowLocal        bool
	}{
		{"commit is an option", repo, inject, true},
		{"commit is a revision expression", repo, "HEAD", true},
		{"url is an option", inject, commit, true},
		{"url is an ssh option", "-oProxyCommand=touch " + marker, commit, true},
		{"ext remote helper", "ext::sh -c touch% " + marker, commit, true},
		{"fd remote helper", "fd::0", commit, true},
		{"ssh host is an option", "ssh://-oProxyCommand=touch%20" + marker + "/r", commit, true},
		{"file url without allowLocal", "file://" + repo, commit, false},
		{"local path without allowLocal", repo, commit, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.FetchFlake(testContext(t), tc.url, tc.commit, FetchOptions{AllowLocal: tc.allowLocal})
			if !errors.Is(err, gitsource.ErrInvalid) {
				t.Errorf("FetchFlake(%q, %q) = %v, want a refusal (gitsource.ErrInvalid)", tc.url, tc.commit, err)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatalf("the injected command ran: %s exists", marker)
			}
		})
	}
	// The same repository is fetched when the operator allows local ones.
	if _, err := n.FetchFlake(testContext(t), "file://"+repo, commit, FetchOptions{AllowLocal: true}); err != nil {
		t.Fatalf("file:// with AllowLocal: %v", err)
	}
}

// A flake from a remote repository whose lock file names an input on the
// worker's disk is refused unless local repositories are allowed: Nix
// reads such inputs itself, so git's transport rules do not stop it, and
// the archive would carry the input to the cache.
func TestFetchFlakeRefusesLocalInputs(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	secret := "worker-local-secret-" + filepath.Base(t.TempDir())
	lib, _ := gitRepo(t, map[string]string{"flake.nix": `{ outputs = { self }: { lib.word = "` + secret + `"; }; }`}, nil)
	app, commit := gitRepo(t, map[string]string{"flake.nix": `{
  inputs.lib.url = "git+file://` + lib + `";
  outputs = { self, lib }: { };
}`}, func(dir string) {
		// Locked with a store of its own: n's store starts without lib.
		if _, err := newTestNix(t).output(ctx, "nix", "flake", "lock", "path:"+dir); err != nil {
			t.Fatal(err)
		}
	})
	fakeSSH, _ := newFakeSSH(t)
	remote := "ssh://git.example.invalid" + app
	opts := FetchOptions{SSHKey: []byte("KEY"), SSH: fakeSSH}
	before := storeHolding(t, n, secret)

	_, err := n.FetchFlake(ctx, remote, commit, opts)
	if !errors.Is(err, gitsource.ErrInvalid) || !strings.Contains(err.Error(), `flake input "lib" is local`) {
		t.Fatalf("FetchFlake = %v, want a refusal naming the local input", err)
	}
	if after := storeHolding(t, n, secret); after != before {
		t.Fatalf("the local input reached the store (%d paths hold it, %d before)", after, before)
	}
	opts.AllowLocal = true
	fetched, err := n.FetchFlake(ctx, remote, commit, opts)
	if err != nil || len(fetched.InputPaths) != 1 {
		t.Fatalf("with AllowLocal: %+v, %v", fetched, err)
	}
	if storeHolding(t, n, secret) == before {
		t.Fatal("the allowed fetch did not bring the input either: the store probe sees nothing")
	}
}

// storeHolding counts the files of n's store that contain word.
func storeHolding(t *testing.T, n *Nix, word string) int {
	t.Helper()
	count := 0
	filepath.WalkDir(n.Store, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(path); strings.Contains(string(b), word) {
				count++
			}
		}
		return nil
	})
	return count
}
