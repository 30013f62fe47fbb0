package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/wire"
)

func TestWritesNewDeletesOldKeepsPublished(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, fmt.Sprintf("v%d.txt", wire.OldestVersion-1))
	if err := os.WriteFile(old, []byte("client\nserver\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the file below the oldest version was kept")
	}
	for ver := wire.OldestVersion; ver <= wire.NewestVersion; ver++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("v%d.txt", ver)))
		if err != nil || string(b) != wire.Schema(ver) {
			t.Errorf("v%d.txt not written as the code describes it: %v", ver, err)
		}
	}
	// A second run changes nothing.
	if err := run(dir); err != nil {
		t.Fatal(err)
	}
}

func TestRefusesToRewriteAPublishedVersion(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, fmt.Sprintf("v%d.txt", wire.NewestVersion))
	edited := wire.Schema(wire.NewestVersion) + "0:{}\n"
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run(dir)
	if err == nil || !strings.Contains(err.Error(), "no longer matches the code") {
		t.Fatalf("got %v", err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != edited {
		t.Error("a published schema file was rewritten")
	}
}
