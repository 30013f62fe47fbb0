package nix

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
)

// PathInfo is the store's metadata of one valid path (`nix path-info --json`).
type PathInfo struct {
	Path             string   `json:"path"`
	NarHash          string   `json:"narHash"` // as Nix printed it (2.8: SRI sha256-<base64>); see NarHashNix32
	NarSize          int64    `json:"narSize"`
	References       []string `json:"references"` // full store paths
	Deriver          string   `json:"deriver,omitempty"`
	CA               string   `json:"ca,omitempty"`
	Signatures       []string `json:"signatures,omitempty"`
	RegistrationTime int64    `json:"registrationTime,omitempty"`
	Ultimate         bool     `json:"ultimate,omitempty"`
	// Valid is false for a path the store does not have (2.8 lists it
	// with "valid": false instead of failing).
	Valid *bool `json:"valid,omitempty"`
}

// IsValid reports whether the store has the path.
func (p PathInfo) IsValid() bool { return p.Valid == nil || *p.Valid }

// PathInfo returns the metadata of paths, in the order given; an invalid
// path is an error.
func (n *Nix) PathInfo(ctx context.Context, paths ...string) ([]PathInfo, error) {
	infos, err := n.queryPathInfo(ctx, paths)
	if err != nil {
		return nil, err
	}
	for _, info := range infos {
		if !info.IsValid() {
			return nil, fmt.Errorf("nix: path %s is not valid in the store", info.Path)
		}
	}
	return infos, nil
}

func (n *Nix) queryPathInfo(ctx context.Context, paths []string) ([]PathInfo, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	n.logger().Debug("nix: path-info", "paths", len(paths))
	byPath := map[string]PathInfo{}
	err := forDrvsAndOthers(paths, func(extra, group []string) error {
		args := slices.Concat([]string{"path-info", "--json", "--sigs"}, extra, group)
		out, err := n.output(ctx, "nix", args...)
		if err != nil {
			return err
		}
		// 2.8 prints an array, newer Nix an object keyed by path.
		infos, err := parsePathInfoJSON(out)
		if err != nil {
			return fmt.Errorf("%w (nix %s)", err, strings.Join(args, " "))
		}
		for _, info := range infos {
			byPath[info.Path] = info
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	infos := make([]PathInfo, 0, len(paths))
	for _, p := range paths {
		info, ok := byPath[p]
		if !ok {
			return nil, fmt.Errorf("nix: path-info did not describe %s", p)
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// ValidPaths returns which of paths the store has, in the order given.
func (n *Nix) ValidPaths(ctx context.Context, paths ...string) ([]string, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	// `nix-store --check-validity --print-invalid` names the invalid ones
	// and succeeds; path-info refuses an invalid .drv outright.
	out, err := n.output(ctx, "nix-store", append([]string{"--check-validity", "--print-invalid"}, paths...)...)
	if err != nil {
		return nil, err
	}
	invalid := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			invalid[line] = true
		}
	}
	var valid []string
	for _, p := range paths {
		if !invalid[p] {
			valid = append(valid, p)
		}
	}
	return valid, nil
}

// MissingPaths returns which of paths the store lacks.
func (n *Nix) MissingPaths(ctx context.Context, paths ...string) ([]string, error) {
	valid, err := n.ValidPaths(ctx, paths...)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, p := range paths {
		if !slices.Contains(valid, p) {
			missing = append(missing, p)
		}
	}
	return missing, nil
}

// Closure returns the runtime closure of paths (`nix-store -qR`).
func (n *Nix) Closure(ctx context.Context, paths ...string) ([]string, error) {
	out, err := n.output(ctx, "nix-store", append([]string{"--query", "--requisites"}, paths...)...)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// DumpPath streams the NAR serialisation of a store path into w.
func (n *Nix) DumpPath(ctx context.Context, path string, w io.Writer) error {
	n.logger().Debug("nix: dump-path", "path", path)
	args := []string{"store", "dump-path", path}
	if strings.HasSuffix(path, ".drv") {
		// Without it Nix 2.8 dumps the derivation's output instead.
		args = append(args, "--derivation")
	}
	cmd := n.command(ctx, "nix", args...)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = w, &stderr
	if err := cmd.Run(); err != nil {
		return commandError(ctx, cmd, err, stderr.String())
	}
	return nil
}

// CopyFrom copies paths and their closures from a binary cache (such as
// file:///dir or http://…/cache/x) into the store.
//
// This is also how to import a NAR with known metadata: Nix 2.8 has no CLI
// for "NAR + narinfo" (`nix-store --import` wants --export framing, `nix
// store add-path` computes a different path), so write a throw-away cache
// directory (nix-cache-info, <hash>.narinfo, nar/…) and copy from it.
// trustedKeys empty disables the signature check (--no-check-sigs).
func (n *Nix) CopyFrom(ctx context.Context, cacheURL string, trustedKeys []string, paths ...string) error {
	n.logger().Info("nix: copying from binary cache", "cache", cacheURL, "paths", len(paths))
	args := []string{"copy", "--from", cacheURL}
	if len(trustedKeys) == 0 {
		args = append(args, "--no-check-sigs")
	} else {
		args = append(args, "--option", "trusted-public-keys", strings.Join(trustedKeys, " "))
	}
	if n.Store != "" {
		args = append(args, "--to", n.Store)
	}
	return n.copyPaths(ctx, args, paths)
}

// CopyTo copies paths and their closures from the store into a binary cache
// URL (e.g. file:///dir?compression=zstd).
func (n *Nix) CopyTo(ctx context.Context, cacheURL string, paths ...string) error {
	n.logger().Info("nix: copying to binary cache", "cache", cacheURL, "paths", len(paths))
	return n.copyPaths(ctx, []string{"copy", "--to", cacheURL}, paths)
}

// copyPaths runs nix copy on paths (see forDrvsAndOthers).
func (n *Nix) copyPaths(ctx context.Context, args, paths []string) error {
	return forDrvsAndOthers(paths, func(extra, group []string) error {
		_, err := n.output(ctx, "nix", slices.Concat(args, extra, group)...)
		return err
	})
}

// forDrvsAndOthers calls run once for the .drv files among paths with
// --derivation and once for the rest without it. Nix 2.8 takes a .drv
// argument of path-info or copy to mean its outputs (building them for
// copy); --derivation on an output path might resolve it to its deriver.
func forDrvsAndOthers(paths []string, run func(extraArgs, group []string) error) error {
	var drvs, others []string
	for _, p := range paths {
		if strings.HasSuffix(p, ".drv") {
			drvs = append(drvs, p)
		} else {
			others = append(others, p)
		}
	}
	if len(drvs) > 0 {
		if err := run([]string{"--derivation"}, drvs); err != nil {
			return err
		}
	}
	if len(others) > 0 {
		return run(nil, others)
	}
	return nil
}
