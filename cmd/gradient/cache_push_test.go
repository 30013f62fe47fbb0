package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
)

// TestCachePushToNix pushes a closure built by the real Nix with the CLI,
// lists it, prints a narinfo, and has Nix copy it back with signatures
// checked.
func TestCachePushToNix(t *testing.T) {
	if _, err := exec.LookPath("nix"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("nix is not installed: .ci/run must install nix-bin")
		}
		t.Skip("nix is not installed (.ci/run installs nix-bin)")
	}
	dir := t.TempDir()
	nixEnv := func(extra ...string) {
		conf := append([]string{"experimental-features = nix-command flakes", "substituters =", "flake-registry =",
			"sandbox = false", "build-users-group =", "sandbox-paths = /bin /lib /lib64 /usr"}, extra...)
		t.Setenv("NIX_CONFIG", strings.Join(conf, "\n"))
	}
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	t.Setenv("NIX_CONF_DIR", filepath.Join(dir, "etc"))
	t.Setenv("NIX_USER_CONF_FILES", "")
	t.Setenv("HOME", filepath.Join(dir, "home"))
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	nixEnv()

	db, err := storage.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	nars, err := narstore.OpenLocal(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(cliAdminToken))
	srv := server.New(db, server.Config{AdminTokenHash: hex.EncodeToString(sum[:]), NarStore: nars, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); srv.Close(); db.Close() })
	s := &adminServer{url: hs.URL, db: db}

	src := filepath.Join(dir, "src")
	file := filepath.Join(dir, "d.nix")
	os.WriteFile(file, []byte(`rec {
  hello = builtins.derivation { name = "hello"; system = builtins.currentSystem; builder = "/bin/sh"; args = ["-c" "echo hello > $out"]; };
  greet = builtins.derivation { name = "greet"; system = builtins.currentSystem; builder = "/bin/sh"; args = ["-c" "echo ${hello} > $out"]; };
}`), 0o644)
	out, err := exec.Command("nix-build", file, "-A", "greet", "--no-out-link", "--store", src).Output()
	if err != nil {
		t.Fatalf("nix-build: %v", err)
	}
	greet := strings.TrimSpace(string(out))

	s.ok(t, "cache", "create", "main", "--public")
	pub := strings.TrimSpace(s.ok(t, "cache", "public-key", "main"))
	mustContain(t, s.ok(t, "cache", "push", "main", greet, "--recursive", "--store", src), "Pushed "+greet, "-hello (")
	mustContain(t, s.ok(t, "cache", "push", "main", greet, "--store", src), greet+" already in main")
	mustContain(t, s.ok(t, "cache", "paths", "main"), "STORE PATH", greet, "-hello")
	narinfo := s.ok(t, "cache", "narinfo", "main", greet)
	mustContain(t, narinfo, "StorePath: "+greet, "Compression: zstd", "References: ", "-hello", "Deriver: ", "-greet.drv", "Sig: main:")
	hash := strings.TrimPrefix(greet, "/nix/store/")[:32]
	if got := s.ok(t, "cache", "narinfo", "main", hash); got != narinfo {
		t.Fatalf("narinfo by hash differs:\n%s", got)
	}
	resp, err := http.Get(hs.URL + "/cache/main/" + hash + ".narinfo")
	if err != nil {
		t.Fatal(err)
	}
	var served bytes.Buffer
	served.ReadFrom(resp.Body)
	resp.Body.Close()
	if served.String() != narinfo {
		t.Fatalf("the cache serves\n%s\nthe CLI printed\n%s", served.String(), narinfo)
	}

	nixEnv("require-sigs = true", "trusted-public-keys = "+pub)
	dst := filepath.Join(dir, "dst")
	if out, err := exec.Command("nix", "copy", "--from", hs.URL+"/cache/main", "--to", dst, greet).CombinedOutput(); err != nil {
		t.Fatalf("nix copy: %v: %s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dst, greet)); err != nil || !strings.HasSuffix(string(b), "-hello\n") {
		t.Fatalf("copied greet: %q, %v", b, err)
	}

	key := s.ok(t, "cache", "key", "create", "main")
	mustContain(t, key, "shown only now", "\nGRAD")
	s.fails(t, exitFail, "has no path", "cache", "narinfo", "main", "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr")
}
