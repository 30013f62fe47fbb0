package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/nix"
)

// Without --system-features the worker advertises what the local Nix is
// configured with.
func TestSystemFeaturesComeFromNix(t *testing.T) {
	if _, err := exec.LookPath("nix"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("nix is not installed: .ci/run must install nix-bin")
		}
		t.Skip("nix is not installed")
	}
	out, err := exec.Command("nix", "--extra-experimental-features", "nix-command", "show-config", "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	var want []string
	json.Unmarshal(cfg["system-features"].Value, &want)
	got := detectSystemFeatures(t.Context(), &nix.Nix{}, slog.New(slog.DiscardHandler))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("features %v, nix says %v", got, want)
	}
}

func TestSystemFeaturesWithoutNix(t *testing.T) {
	var logs bytes.Buffer
	got := detectSystemFeatures(t.Context(), &nix.Nix{BinDir: t.TempDir()}, slog.New(slog.NewTextHandler(&logs, nil)))
	if got != nil || !strings.Contains(logs.String(), "cannot read system features") {
		t.Errorf("features %v, log %q", got, logs.String())
	}
}
