package nix

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Version is a Nix release (`nix --version`).
type Version struct {
	Major, Minor, Patch int
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor or later.
func (v Version) AtLeast(major, minor int) bool {
	if v.Major != major {
		return v.Major > major
	}
	return v.Minor >= minor
}

// Releases where the CLI changed in ways this package cares about.
var (
	// `nix config show` replaced `nix show-config`.
	versionConfigShow = Version{2, 20, 0}
)

var versionRE = regexp.MustCompile(`(\d+)\.(\d+)(?:\.(\d+))?`)

// ParseVersion reads the output of `nix --version`, such as
// "nix (Nix) 2.8.0", "nix (Nix) 2.24.10" or "nix (Nix) 2.26.0pre20250101_abc"
// (Lix prints "nix (Lix, like Nix) 2.91.1", which parses too).
func ParseVersion(s string) (Version, error) {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	// The number follows the last ')' so that "(Lix, like Nix) 2.91" works.
	rest := line[strings.LastIndex(line, ")")+1:]
	m := versionRE.FindStringSubmatch(rest)
	if m == nil {
		return Version{}, fmt.Errorf("nix: cannot read a version in %q", line)
	}
	var v Version
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	if m[3] != "" {
		v.Patch, _ = strconv.Atoi(m[3])
	}
	return v, nil
}

// versionCache remembers the first successful `nix --version` of a Nix.
// A failure is not cached: the binary might appear later (or the context
// of the first caller ended).
type versionCache struct {
	mu    sync.Mutex
	known bool
	v     Version
}

// Version returns the version of the nix binary, running `nix --version`
// once per Nix value.
func (n *Nix) Version(ctx context.Context) (Version, error) {
	n.version.mu.Lock()
	defer n.version.mu.Unlock()
	if n.version.known {
		return n.version.v, nil
	}
	out, err := n.output(ctx, "nix", "--version")
	if err != nil {
		return Version{}, err
	}
	v, err := ParseVersion(string(out))
	if err != nil {
		return Version{}, err
	}
	n.version.known, n.version.v = true, v
	n.logger().Debug("nix: version", "version", v)
	return v, nil
}
