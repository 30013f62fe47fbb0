package nix

import (
	"errors"
	"os"
	"path/filepath"
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
