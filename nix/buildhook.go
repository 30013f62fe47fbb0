package nix

import (
	"os"
	"path/filepath"
)

// declineHookScript is the build hook the worker's builds run with: it
// declines every build for good, so the daemon builds locally. Gradient
// spreads builds over its own workers and never uses Nix's remote
// builders; Nix's own hook (`nix __build-remote`) would answer the same,
// but the daemon starts a hook for each build operation, and a Nix
// process costs 20-40 ms where /bin/sh and cat cost 1-2. Nix 2.8 cannot
// turn the hook off (an empty build-hook is an error there).
//
// The protocol (Nix's HookInstance): the daemon writes its settings and
// then a "try" line to the hook's standard input and reads the reply from
// its standard error; "# decline-permanently" ends the hook's use for the
// operation, and the daemon kills it.
const declineHookScript = `#!/bin/sh
# Written by Gradient's worker: decline remote builds (see nix/buildhook.go).
echo '# decline-permanently' >&2
exec cat >/dev/null
`

// buildHookName is the hook's file in WorkDir.
const buildHookName = "gradient-build-hook"

// buildHook returns the decline hook's path, written to WorkDir on first
// use (a new file renamed over the name, so the content is this one
// whoever made the name before); "" (the daemon's own hook) when it
// cannot be written.
func (n *Nix) buildHook() string {
	n.hookOnce.Do(func() {
		dir := n.WorkDir
		if dir == "" {
			dir = os.TempDir()
		}
		dir, err := filepath.Abs(dir)
		var f *os.File
		if err == nil {
			f, err = os.CreateTemp(dir, buildHookName+"-*")
		}
		if err == nil {
			_, err = f.WriteString(declineHookScript)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Chmod(f.Name(), 0o755)
			}
			if err == nil {
				err = os.Rename(f.Name(), filepath.Join(dir, buildHookName))
			}
			if err != nil {
				os.Remove(f.Name())
			}
		}
		if err != nil {
			n.logger().Warn("nix: no build hook of our own; builds start Nix's", "error", err)
			return
		}
		n.hookPath = filepath.Join(dir, buildHookName)
	})
	return n.hookPath
}
