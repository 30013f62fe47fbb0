package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/workersession"
)

func TestLoadIDCreatesThenReuses(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state")
	id, err := LoadID(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if !workersession.ValidUUID(id) || id[14] != '7' {
		t.Fatalf("created id %q: want a UUIDv7", id)
	}
	b, err := os.ReadFile(filepath.Join(dir, IDFileName))
	if err != nil || strings.TrimSpace(string(b)) != id {
		t.Fatalf("worker-id file holds %q (%v), want %q", b, err, id)
	}
	again, err := LoadID(dir, "")
	if err != nil || again != id {
		t.Fatalf("second start: %q, %v; want the same id %q", again, err, id)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("base dir holds %d entries, want only worker-id (no temporary files)", len(entries))
	}
}

func TestLoadIDTrimsWhitespace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const id = "0190c3a4-5b6d-7e8f-9a0b-1c2d3e4f5a6b"
	if err := os.WriteFile(filepath.Join(dir, IDFileName), []byte("  "+id+"\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadID(dir, ""); err != nil || got != id {
		t.Fatalf("got %q, %v", got, err)
	}
}

func TestLoadIDInvalidIsFatal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, IDFileName)
	if err := os.WriteFile(path, []byte("not-a-uuid\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadID(dir, "")
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "not a UUID") {
		t.Fatalf("got %v, want an error naming the file", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "not-a-uuid\n" {
		t.Fatalf("the invalid file was rewritten: %q", b)
	}
}

func TestLoadIDFixedOverrides(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const fixed = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
	got, err := LoadID(dir, fixed)
	if err != nil || got != strings.ToLower(fixed) {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, IDFileName)); !os.IsNotExist(err) {
		t.Fatalf("a fixed id wrote the id file: %v", err)
	}
	if _, err := LoadID(dir, "worker-1"); err == nil {
		t.Fatal("a fixed id that is not a UUID was accepted")
	}
}
