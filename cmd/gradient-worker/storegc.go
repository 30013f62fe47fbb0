package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/worker/nixexec"
)

// parseSize reads a byte count: digits with an optional K, M, G or T
// suffix (powers of 1024, as Nix's min-free takes them; a trailing B or
// iB is accepted too). Empty is 0.
func parseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	upper := strings.ToUpper(s)
	upper = strings.TrimSuffix(upper, "IB")
	upper = strings.TrimSuffix(upper, "B")
	shift := 0
	if upper != "" {
		switch upper[len(upper)-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			upper = upper[:len(upper)-1]
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(upper), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want bytes, with an optional K, M, G or T suffix", s)
	}
	if shift > 0 && n > math.MaxUint64>>shift {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return n << shift, nil
}

// storeGC builds the store's collector, or nil when --gc-min-free is 0.
// It needs GC roots: without them a collection would delete what
// running jobs use.
func storeGC(ctx context.Context, opts options, n *nix.Nix, gcRootsDir string, reg prometheus.Registerer, log *slog.Logger) (*nixexec.StoreGC, error) {
	if opts.GCMinFree == 0 {
		return nil, nil
	}
	if gcRootsDir == "" {
		return nil, errors.New("--gc-min-free needs GC roots, but --gcroots-dir is empty or unusable")
	}
	dir, err := n.RealStoreDir(ctx)
	if err != nil {
		return nil, fmt.Errorf("--gc-min-free: finding the store's directory: %w", err)
	}
	return nixexec.NewStoreGC(nixexec.StoreGCConfig{Store: n, Dir: dir, MinFree: opts.GCMinFree, MaxFree: opts.GCMaxFree,
		Interval: opts.GCCheckInterval, Logger: log, Metrics: reg})
}
