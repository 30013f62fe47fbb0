package nixtest

import (
	"os"
	"path/filepath"
	"testing"
)

// SSHHost is an "ssh" program for git over SSH in tests: it runs the
// remote git command locally, as an SSH server would, but only for a
// caller that presents an OpenSSH private key with -i; others get the
// host's "Permission denied (publickey)". KeysUsed is a file listing the
// key files it was given, Options one of the -o options, one per line.
type SSHHost struct {
	Program  string
	KeysUsed string
	Options  string
}

// NewSSHHost writes the program into a temporary directory of t.
func NewSSHHost(t testing.TB) SSHHost {
	t.Helper()
	dir := t.TempDir()
	h := SSHHost{Program: filepath.Join(dir, "fake-ssh"), KeysUsed: filepath.Join(dir, "keys-used"), Options: filepath.Join(dir, "options")}
	script := `#!/bin/bash
key=""
while [ $# -gt 1 ]; do
  case "$1" in
    -i) key="$2"; shift 2 ;;
    -o) echo "$2" >> '` + h.Options + `'; shift 2 ;;
    *) shift ;;
  esac
done
if [ -z "$key" ] || ! head -1 "$key" | grep -q 'BEGIN OPENSSH PRIVATE KEY'; then
  echo "git@example.invalid: Permission denied (publickey)." >&2
  exit 255
fi
echo "$key" >> '` + h.KeysUsed + `'
exec bash -c "$1"
`
	if err := os.WriteFile(h.Program, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return h
}
