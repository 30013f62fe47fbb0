package nix

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// gcFlake's lone output is referenced by nothing else.
const gcFlake = `{
  outputs = { self }: let
    mk = name: script: builtins.derivation {
      inherit name; system = "x86_64-linux"; builder = "/bin/sh"; args = [ "-c" script ];
    };
  in rec {
    hello = mk "hello" "echo hello > $out";
    greet = mk "greet" "echo ${hello} > $out";
    lone = mk "lone" "echo lone > $out";
  };
}
`

func TestRealStoreDir(t *testing.T) {
	for _, tc := range []struct{ uri, want string }{
		{"", "/nix/store"},
		{"auto", "/nix/store"},
		{"daemon", "/nix/store"},
		{"local", "/nix/store"},
		{"/tmp/chroot", "/tmp/chroot/nix/store"},
		{"/tmp/chroot/", "/tmp/chroot/nix/store"},
		{"local?root=/srv/x", "/srv/x/nix/store"},
		{"/srv/x?real=/mnt/store", "/mnt/store"},
	} {
		got, err := realStoreDir(tc.uri)
		if err != nil || got != tc.want {
			t.Errorf("realStoreDir(%q) = %q, %v; want %q", tc.uri, got, err, tc.want)
		}
	}
	for _, uri := range []string{"ssh://builder", "s3://bucket", "https://cache.nixos.org"} {
		if got, err := realStoreDir(uri); err == nil {
			t.Errorf("realStoreDir(%q) = %q, want an error: not a local disk", uri, got)
		}
	}
}

// A collection through the daemon deletes built outputs no root holds,
// keeps those behind an indirect root (with their closure), and says how
// much it freed; the store builds again afterwards.
func TestCollectGarbageDeletesDeadKeepsRooted(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	dir, commit := gitRepo(t, map[string]string{"flake.nix": gcFlake}, nil)
	ref := "git+file://" + dir + "?rev=" + commit
	build := func(attr string) string {
		drv, err := n.Instantiate(ctx, ref, attr)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := n.Build(ctx, drv, BuildOptions{Timeout: 30 * time.Second, Cores: 1})
		if err != nil {
			t.Fatal(err)
		}
		return outs["out"]
	}
	greet := build("greet") // references hello
	rootDir := t.TempDir()
	link := filepath.Join(rootDir, "greet")
	if err := os.Symlink(greet, link); err != nil {
		t.Fatal(err)
	}
	if err := n.AddIndirectRoot(ctx, link); err != nil {
		t.Fatal(err)
	}
	hello, err := n.Closure(ctx, greet)
	if err != nil {
		t.Fatal(err)
	}
	// A dead output: built, then its root (the daemon connection's
	// temporary root) dropped by the collection.
	dead := build("lone")
	res, err := n.CollectGarbage(ctx, FreeAll)
	if err != nil {
		t.Fatal(err)
	}
	if res.Paths == 0 || res.BytesFreed == 0 {
		t.Errorf("collection %+v, want paths deleted and bytes freed", res)
	}
	valid, err := n.ValidPaths(ctx, append([]string{dead}, hello...)...)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(valid, dead) {
		t.Errorf("dead output %s survived the collection", dead)
	}
	for _, p := range hello {
		if !slices.Contains(valid, p) {
			t.Errorf("rooted closure path %s was deleted", p)
		}
	}
	if _, err := os.Stat(filepath.Join(n.Store, dead)); !os.IsNotExist(err) {
		t.Errorf("dead output still on disk: %v", err)
	}
	if again := build("lone"); again != dead {
		t.Errorf("rebuilt %s, want %s", again, dead)
	}
}
