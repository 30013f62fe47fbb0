package nix

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"

	"gradient.dev/gradient/nix/daemon"
)

// GCResult is what a garbage collection deleted.
type GCResult = daemon.GCResult

// FreeAll asks CollectGarbage to delete every dead path.
const FreeAll = daemon.FreeAll

// CollectGarbage deletes dead store paths (those no GC root reaches)
// until maxFreed bytes are freed, through the daemon's collect-garbage
// operation. The idle daemon connections end first, the long operations' pools
// too, so the temporary roots they hold for what they added (a build's
// outputs) go with them.
func (n *Nix) CollectGarbage(ctx context.Context, maxFreed uint64) (GCResult, error) {
	for _, pool := range []*daemon.Client{n.longDaemon.Load(), n.lowDaemon.Load()} {
		if pool != nil {
			pool.DropIdle()
		}
	}
	res, err := n.daemonClient().CollectGarbage(ctx, maxFreed)
	return res, daemonError(ctx, err)
}

// RealStoreDir is the directory on disk holding the store's paths: the
// file system whose free space a collection restores. It is /nix/store
// for the default store and <root>/nix/store for a chroot store (Store,
// or else the store setting of Nix's configuration).
func (n *Nix) RealStoreDir(ctx context.Context) (string, error) {
	uri := n.Store
	if uri == "" {
		settings, err := n.showConfig(ctx)
		if err != nil {
			return "", err
		}
		uri = settings["store"]
	}
	return realStoreDir(uri)
}

// realStoreDir reads a store URI: "", auto, daemon and local are the
// system store; a path or local?root=DIR is a chroot store under it.
func realStoreDir(uri string) (string, error) {
	const system = "/nix/store"
	base, query, _ := strings.Cut(uri, "?")
	params, err := url.ParseQuery(query)
	if err != nil {
		return "", fmt.Errorf("store %q: %w", uri, err)
	}
	if real := params.Get("real"); real != "" {
		return filepath.Clean(real), nil
	}
	root := params.Get("root")
	switch {
	case base == "" || base == "auto" || base == "daemon" || base == "unix://":
		if root == "" {
			return system, nil
		}
	case base == "local":
	case strings.HasPrefix(base, "/"):
		if root == "" {
			root = base
		}
	default:
		return "", fmt.Errorf("store %q is not on this machine's disk", uri)
	}
	if root == "" {
		return system, nil
	}
	return filepath.Join(root, system), nil
}
