package main

import (
	"context"
	"log/slog"
	"testing"

	"gradient.dev/gradient/nix"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"": 0, "0": 0, "4096": 4096, "512K": 512 << 10, "512k": 512 << 10, "100M": 100 << 20, "5G": 5 << 30,
		"5GiB": 5 << 30, "5gb": 5 << 30, " 2T ": 2 << 40, "7B": 7,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"G", "-1", "1.5G", "5X", "5 G B", "20000000000G", "0x10"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}

// The collector is off by default and refuses to run without GC roots.
func TestStoreGCOptions(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	n := &nix.Nix{Store: t.TempDir()}
	if gc, err := storeGC(context.Background(), options{}, n, "/gcroots", nil, log); gc != nil || err != nil {
		t.Errorf("without --gc-min-free: %v, %v; want no collector", gc, err)
	}
	if _, err := storeGC(context.Background(), options{GCMinFree: 1 << 30}, n, "", nil, log); err == nil {
		t.Error("--gc-min-free without GC roots was accepted")
	}
	if gc, err := storeGC(context.Background(), options{GCMinFree: 1 << 30}, n, "/gcroots", nil, log); gc == nil || err != nil {
		t.Errorf("--gc-min-free with GC roots: %v, %v", gc, err)
	}
}
