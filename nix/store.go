package nix

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"gradient.dev/gradient/nix/daemon"
	"gradient.dev/gradient/nixbase32"
)

// PathInfo is the store's metadata of one valid path.
type PathInfo struct {
	Path             string   `json:"path"`
	NarHash          string   `json:"narHash"` // sha256:<nix32>; see NarHashNix32
	NarSize          int64    `json:"narSize"`
	References       []string `json:"references"` // full store paths
	Deriver          string   `json:"deriver,omitempty"`
	CA               string   `json:"ca,omitempty"`
	Signatures       []string `json:"signatures,omitempty"`
	RegistrationTime int64    `json:"registrationTime,omitempty"`
	Ultimate         bool     `json:"ultimate,omitempty"`
}

func pathInfoOf(d *daemon.PathInfo) PathInfo {
	return PathInfo{
		Path: d.Path, NarHash: "sha256:" + nixbase32.Encode(d.NarHash), NarSize: int64(d.NarSize),
		References: d.References, Deriver: d.Deriver, CA: d.CA, Signatures: d.Signatures,
		RegistrationTime: d.RegistrationTime.Unix(), Ultimate: d.Ultimate,
	}
}

// PathInfo returns the metadata of paths, in the order given; an invalid
// path is an error.
func (n *Nix) PathInfo(ctx context.Context, paths ...string) ([]PathInfo, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	got, err := n.daemonClient().QueryPathInfos(ctx, paths)
	if err != nil {
		return nil, daemonError(ctx, err)
	}
	infos := make([]PathInfo, len(paths))
	for i, info := range got {
		if info == nil {
			return nil, fmt.Errorf("nix: path %s is not valid in the store", paths[i])
		}
		infos[i] = pathInfoOf(info)
	}
	return infos, nil
}

// ValidPaths returns which of paths the store has, in the order given.
func (n *Nix) ValidPaths(ctx context.Context, paths ...string) ([]string, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	got, err := n.daemonClient().QueryValidPaths(ctx, paths)
	if err != nil {
		return nil, daemonError(ctx, err)
	}
	return slices.DeleteFunc(slices.Clone(paths), func(p string) bool { return !slices.Contains(got, p) }), nil
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

// Closure returns the runtime closure of paths: them and everything
// they reference, directly or not; sorted.
func (n *Nix) Closure(ctx context.Context, paths ...string) ([]string, error) {
	seen := map[string]bool{}
	next := slices.Compact(slices.Sorted(slices.Values(paths)))
	for _, p := range next {
		seen[p] = true
	}
	for len(next) > 0 {
		infos, err := n.PathInfo(ctx, next...)
		if err != nil {
			return nil, err
		}
		next = next[:0:0]
		for _, info := range infos {
			for _, ref := range info.References {
				if !seen[ref] {
					seen[ref] = true
					next = append(next, ref)
				}
			}
		}
	}
	return slices.Sorted(func(yield func(string) bool) {
		for p := range seen {
			if !yield(p) {
				return
			}
		}
	}), nil
}

// DumpPath streams the NAR serialisation of a store path into w.
func (n *Nix) DumpPath(ctx context.Context, path string, w io.Writer) error {
	n.logger().Debug("nix: dump-path", "path", path)
	if _, err := n.daemonClient().NarFromPath(ctx, path, w); err != nil {
		return daemonError(ctx, err)
	}
	return nil
}

// AddIndirectRoot registers link, a symlink to a store path anywhere on
// disk, as a GC root for as long as the link exists.
func (n *Nix) AddIndirectRoot(ctx context.Context, link string) error {
	return daemonError(ctx, n.daemonClient().AddIndirectRoot(ctx, link))
}

// CopyFrom copies paths and their closures from a binary cache (such as
// file:///dir or http://…/cache/x) into the store. trustedKeys empty
// disables the signature check (--no-check-sigs).
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

// copyPaths runs nix copy on paths: once for the .drv files among them
// with --derivation (else Nix 2.8 takes a .drv to mean its outputs,
// building them) and once for the rest.
func (n *Nix) copyPaths(ctx context.Context, args, paths []string) error {
	var drvs, others []string
	for _, p := range paths {
		if strings.HasSuffix(p, ".drv") {
			drvs = append(drvs, p)
		} else {
			others = append(others, p)
		}
	}
	for _, group := range []struct {
		extra, paths []string
	}{{[]string{"--derivation"}, drvs}, {nil, others}} {
		if len(group.paths) > 0 {
			if _, err := n.output(ctx, "nix", slices.Concat(args, group.extra, group.paths)...); err != nil {
				return err
			}
		}
	}
	return nil
}
