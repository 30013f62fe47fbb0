package nix

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/nix/daemon"
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

// ImportNARs adds items to the store through the daemon (AddToStoreNar),
// each NAR streamed from its file through zstd; the daemon verifies each
// against its hash and size. Items go in reference order; references
// outside items must already be valid. Items already valid are skipped.
func (n *Nix) ImportNARs(ctx context.Context, items []NarImport) error {
	if len(items) == 0 {
		return nil
	}
	imports := make([]daemon.Import, len(items))
	byPath := make(map[string]int, len(items))
	for i, it := range items {
		imp, err := daemonImport(it)
		if err != nil {
			return err
		}
		imports[i] = imp
		byPath[it.StorePath] = i
	}
	var outside []string
	for _, it := range items {
		for _, ref := range it.References {
			if _, in := byPath[ref]; !in && !slices.Contains(outside, ref) {
				outside = append(outside, ref)
			}
		}
	}
	// Checked here because the daemon's own error names neither side clearly.
	if len(outside) > 0 {
		missing, err := n.MissingPaths(ctx, outside...)
		if err != nil {
			return fmt.Errorf("nix: importing NARs: checking references: %w", err)
		}
		if len(missing) > 0 {
			return fmt.Errorf("nix: importing NARs: references neither imported nor valid in the store: %s", strings.Join(missing, ", "))
		}
	}
	paths := make([]string, len(items))
	for i, it := range items {
		paths[i] = it.StorePath
	}
	valid, err := n.ValidPaths(ctx, paths...)
	if err != nil {
		return fmt.Errorf("nix: importing NARs: %w", err)
	}

	start := time.Now()
	c := n.daemonClient()
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return err
	}
	defer dec.Close()
	added := 0
	for _, i := range referenceOrder(items, byPath) {
		it := items[i]
		if slices.Contains(valid, it.StorePath) {
			continue
		}
		if err := n.importOne(ctx, c, dec, imports[i], it.NarZst); err != nil {
			return fmt.Errorf("nix: importing %s: %w", it.StorePath, err)
		}
		added++
	}
	n.logger().Debug("nix: imported NARs", "paths", added, "took", time.Since(start))
	return nil
}

func (n *Nix) importOne(ctx context.Context, c *daemon.Client, dec *zstd.Decoder, imp daemon.Import, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := dec.Reset(f); err != nil {
		return err
	}
	// The paths come from the worker's own cache, which verified them;
	// the daemon still checks the NAR against its hash.
	return daemonError(ctx, c.AddToStoreNar(ctx, imp, dec, true))
}

// referenceOrder lists items' indices so that each comes after the items
// it references (a depth-first walk; self-references are ignored).
func referenceOrder(items []NarImport, byPath map[string]int) []int {
	order := make([]int, 0, len(items))
	state := make([]byte, len(items)) // 0 new, 1 on the walk, 2 placed
	var visit func(i int)
	visit = func(i int) {
		if state[i] != 0 {
			return
		}
		state[i] = 1
		for _, ref := range items[i].References {
			if j, ok := byPath[ref]; ok && j != i {
				visit(j)
			}
		}
		state[i] = 2
		order = append(order, i)
	}
	for i := range items {
		visit(i)
	}
	return order
}

// daemonImport checks an item's metadata and puts it in the daemon's form.
func daemonImport(it NarImport) (daemon.Import, error) {
	if err := checkStorePath(it.StorePath); err != nil {
		return daemon.Import{}, fmt.Errorf("nix: importing %q: %w", it.StorePath, err)
	}
	if it.NarSize <= 0 {
		return daemon.Import{}, fmt.Errorf("nix: importing %s: NAR size %d", it.StorePath, it.NarSize)
	}
	if it.NarZst == "" {
		return daemon.Import{}, fmt.Errorf("nix: importing %s: no NAR file", it.StorePath)
	}
	narHash, err := (PathInfo{Path: it.StorePath, NarHash: it.NarHash}).NarHashNix32()
	if err != nil {
		return daemon.Import{}, fmt.Errorf("nix: importing: %w", err)
	}
	digest, err := nixbase32.Decode(strings.TrimPrefix(narHash, "sha256:"))
	if err != nil {
		return daemon.Import{}, fmt.Errorf("nix: importing %s: %w", it.StorePath, err)
	}
	for _, ref := range it.References {
		if err := checkStorePath(ref); err != nil {
			return daemon.Import{}, fmt.Errorf("nix: importing %s: reference %q: %w", it.StorePath, ref, err)
		}
	}
	if it.Deriver != "" {
		if err := checkStorePath(it.Deriver); err != nil {
			return daemon.Import{}, fmt.Errorf("nix: importing %s: deriver %q: %w", it.StorePath, it.Deriver, err)
		}
	}
	return daemon.Import{Path: it.StorePath, Deriver: it.Deriver, NarHash: digest, NarSize: uint64(it.NarSize),
		References: it.References, CA: it.CA}, nil
}

// checkStorePath accepts /nix/store/<32 nix32 characters>-<name>.
func checkStorePath(p string) error {
	base := baseName(p)
	if filepath.Dir(p) != storeDir || len(base) < 34 || base[32] != '-' {
		return fmt.Errorf("not a store path")
	}
	if _, err := nixbase32.Decode(base[:32]); err != nil {
		return fmt.Errorf("not a store path: %w", err)
	}
	return nil
}
