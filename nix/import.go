package nix

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gradient.dev/gradient/nixbase32"
)

// NarImport is a store path to add from a NAR with known metadata.
type NarImport struct {
	StorePath  string // full /nix/store/... path
	NarHash    string // sha256:<nix32> (SRI and base 16 are accepted too)
	NarSize    int64
	References []string // full store paths
	Deriver    string   // full path or ""
	CA         string
	// NarZst is a file holding the zstd-compressed NAR (as the server's cache stores it).
	NarZst string
}

// ImportNARs adds items to the store, verifying each NAR against its hash
// and size. Nix 2.8 has no CLI for "NAR + metadata" (WORKER.md §1), so this
// writes a throw-away file:// binary cache holding the items and runs `nix
// copy --from` it without signature checks; Nix orders the paths by their
// references. References outside items must already be valid in the store.
// Items that are already valid are skipped by Nix.
func (n *Nix) ImportNARs(ctx context.Context, items []NarImport) error {
	if len(items) == 0 {
		return nil
	}
	inSet := make(map[string]bool, len(items))
	for _, it := range items {
		inSet[it.StorePath] = true
	}
	var outside []string
	for _, it := range items {
		for _, ref := range it.References {
			if !inSet[ref] && !slices.Contains(outside, ref) {
				outside = append(outside, ref)
			}
		}
	}
	// Checked here because Nix's own error names neither side clearly.
	if len(outside) > 0 {
		missing, err := n.MissingPaths(ctx, outside...)
		if err != nil {
			return fmt.Errorf("nix: importing NARs: checking references: %w", err)
		}
		if len(missing) > 0 {
			return fmt.Errorf("nix: importing NARs: references neither imported nor valid in the store: %s", strings.Join(missing, ", "))
		}
	}

	parent := n.WorkDir
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "nar-import-")
	if err != nil {
		return fmt.Errorf("nix: importing NARs: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := writeImportCache(dir, items); err != nil {
		return err
	}

	start := time.Now()
	n.logger().Info("nix: importing NARs", "paths", len(items))
	// --no-recursive: the cache holds only items, not what they reference.
	// .drv files need --derivation (else 2.8 means their outputs) and go
	// last since they reference sources, rarely the other way round.
	var drvs, others []string
	for _, it := range items {
		if strings.HasSuffix(it.StorePath, ".drv") {
			drvs = append(drvs, it.StorePath)
		} else {
			others = append(others, it.StorePath)
		}
	}
	args := []string{"copy", "--from", "file://" + dir, "--no-check-sigs", "--no-recursive"}
	if n.Store != "" {
		args = append(args, "--to", n.Store)
	}
	for _, group := range []struct {
		extra []string
		paths []string
	}{{nil, others}, {[]string{"--derivation"}, drvs}} {
		if len(group.paths) == 0 {
			continue
		}
		if _, err := n.output(ctx, "nix", slices.Concat(args, group.extra, group.paths)...); err != nil {
			return fmt.Errorf("nix: importing %d NARs (%s…): %w", len(group.paths), group.paths[0], err)
		}
	}
	n.logger().Info("nix: imported NARs", "paths", len(items), "took", time.Since(start))
	return nil
}

// writeImportCache lays out a binary cache: nix-cache-info, one
// <hash>.narinfo per item and nar/<hash>.nar.zst linked to item.NarZst.
func writeImportCache(dir string, items []NarImport) error {
	if err := os.Mkdir(filepath.Join(dir, "nar"), 0o755); err != nil {
		return fmt.Errorf("nix: importing NARs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nix-cache-info"), []byte("StoreDir: "+storeDir+"\n"), 0o644); err != nil {
		return fmt.Errorf("nix: importing NARs: %w", err)
	}
	for _, it := range items {
		info, err := narInfoText(it)
		if err != nil {
			return err
		}
		hashPart := baseName(it.StorePath)[:32]
		if err := os.WriteFile(filepath.Join(dir, hashPart+".narinfo"), info, 0o644); err != nil {
			return fmt.Errorf("nix: importing %s: %w", it.StorePath, err)
		}
		if err := linkFile(it.NarZst, filepath.Join(dir, "nar", hashPart+".nar.zst")); err != nil {
			return fmt.Errorf("nix: importing %s: NAR file: %w", it.StorePath, err)
		}
	}
	return nil
}

// linkFile makes dst show src: a hard link is free, and across file
// systems a symlink does (Nix reads through it).
func linkFile(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return err
	}
	return os.Symlink(abs, dst)
}

// narInfoText renders the narinfo of an import; references and deriver are
// base names, as in any binary cache.
func narInfoText(it NarImport) ([]byte, error) {
	base := baseName(it.StorePath)
	if filepath.Dir(it.StorePath) != storeDir || len(base) < 34 || base[32] != '-' {
		return nil, fmt.Errorf("nix: importing %q: not a store path", it.StorePath)
	}
	if _, err := nixbase32.Decode(base[:32]); err != nil {
		return nil, fmt.Errorf("nix: importing %q: not a store path: %w", it.StorePath, err)
	}
	if it.NarSize <= 0 {
		return nil, fmt.Errorf("nix: importing %s: NAR size %d", it.StorePath, it.NarSize)
	}
	if it.NarZst == "" {
		return nil, fmt.Errorf("nix: importing %s: no NAR file", it.StorePath)
	}
	narHash, err := (PathInfo{Path: it.StorePath, NarHash: it.NarHash}).NarHashNix32()
	if err != nil {
		return nil, fmt.Errorf("nix: importing: %w", err)
	}
	refs := make([]string, len(it.References))
	for i, ref := range it.References {
		if filepath.Dir(ref) != storeDir {
			return nil, fmt.Errorf("nix: importing %s: reference %q is not a store path", it.StorePath, ref)
		}
		refs[i] = baseName(ref)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "StorePath: %s\n", it.StorePath)
	fmt.Fprintf(&b, "URL: nar/%s.nar.zst\nCompression: zstd\n", base[:32])
	fmt.Fprintf(&b, "NarHash: %s\n", narHash)
	fmt.Fprintf(&b, "NarSize: %d\n", it.NarSize)
	fmt.Fprintf(&b, "References: %s\n", strings.Join(refs, " "))
	if it.Deriver != "" {
		fmt.Fprintf(&b, "Deriver: %s\n", baseName(it.Deriver))
	}
	if it.CA != "" {
		fmt.Fprintf(&b, "CA: %s\n", it.CA)
	}
	return []byte(b.String()), nil
}
