package nix

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A deploy key reaches git over SSH: the ssh program is called with the
// key file (mode 0600, holding the key) for the repository's host, and the
// key file is gone afterwards. The "ssh" here runs the remote git command
// locally, as an SSH server would.
func TestFetchFlakeWithSSHKey(t *testing.T) {
	n := newTestNix(t)
	repo, commit := newTestRepo(t)
	fakeSSH, log := newFakeSSH(t)
	fetched, err := n.FetchFlake(testContext(t), "ssh://git.example.invalid"+repo, commit, FetchOptions{SSHKey: []byte("THE-DEPLOY-KEY"), SSH: fakeSSH})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(fetched.SourcePath, "/nix/store/") {
		t.Fatalf("source %q", fetched.SourcePath)
	}
	out, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("ssh was never called: %v", err)
	}
	got := string(out)
	for _, want := range []string{"host=git.example.invalid", "mode=600", "content=THE-DEPLOY-KEY"} {
		if !strings.Contains(got, want) {
			t.Errorf("ssh saw %q, want %q", got, want)
		}
	}
	_, rest, _ := strings.Cut(got, "key=")
	keyFile, _, _ := strings.Cut(rest, "\n")
	if _, err := os.Stat(keyFile); !os.IsNotExist(err) {
		t.Errorf("key file %s still exists after the fetch (%v)", keyFile, err)
	}
}

// newFakeSSH writes an "ssh" that runs the remote git command locally, as
// an SSH server would, and logs the host, the key file, its mode and its
// content to log.
func newFakeSSH(t *testing.T) (program, log string) {
	t.Helper()
	dir := t.TempDir()
	log = filepath.Join(dir, "ssh.log")
	program = filepath.Join(dir, "fake-ssh")
	script := `#!/bin/bash
key=""
while [ $# -gt 1 ]; do
  case "$1" in
    -i) key="$2"; shift 2 ;;
    -o) shift 2 ;;
    *) host="$1"; shift ;;
  esac
done
{ echo "host=$host"; echo "key=$key"; stat -c 'mode=%a' "$key"; echo "content=$(cat "$key")"; } >> ` + log + `
exec bash -c "$1"
`
	if err := os.WriteFile(program, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return program, log
}
