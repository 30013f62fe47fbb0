package storage_test

import (
	"errors"
	"strings"
	"testing"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

const (
	pathA = "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-hello"
	pathB = "/nix/store/094qif9n4cq4fdg459qzbhg1c6wywaww-lib"
	drvA  = "/nix/store/9m1skbnr5i43n3yypvda5s65vhfwdx5a-hello.drv"
)

func samplePath(cacheID string) storage.CachePath {
	return storage.CachePath{
		CacheID: cacheID, StorePath: pathA,
		NarHash: "sha256:0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73", NarSize: 120,
		FileHash: "sha256:094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic", FileSize: 80,
		Compression: "zstd", References: []string{pathB, "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-hello"},
		Deriver: drvA, CA: "", ObjectKey: "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic",
	}
}

func TestCachePaths(t *testing.T) {
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		c, err := db.CreateCache(ctx, storage.NewCache{Name: "main"})
		if err != nil {
			t.Fatal(err)
		}
		other, _ := db.CreateCache(ctx, storage.NewCache{Name: "other"})
		p, created, err := db.PutCachePath(ctx, samplePath(c.ID))
		if err != nil || !created {
			t.Fatalf("put: %v, created %v", err, created)
		}
		wantRefs := "094qif9n4cq4fdg459qzbhg1c6wywaww-lib 0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-hello"
		if strings.Join(p.References, " ") != wantRefs || p.Deriver != "9m1skbnr5i43n3yypvda5s65vhfwdx5a-hello.drv" {
			t.Fatalf("references %v, deriver %q: want base names, sorted", p.References, p.Deriver)
		}
		// Idempotent: the same path again keeps one row.
		again := samplePath(c.ID)
		again.NarSize = 999
		got, created, err := db.PutCachePath(ctx, again)
		if err != nil || created || got.NarSize != 120 {
			t.Fatalf("second put: %+v, created %v, %v", got, created, err)
		}
		if _, _, err := db.PutCachePath(ctx, samplePath(other.ID)); err != nil {
			t.Fatal(err)
		}
		got, err = db.CachePath(ctx, c.ID, "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr")
		if err != nil || got.StorePath != pathA || got.FileSize != 80 || strings.Join(got.References, " ") != wantRefs {
			t.Fatalf("get: %+v, %v", got, err)
		}
		if byObj, err := db.CachePathByObject(ctx, c.ID, p.ObjectKey); err != nil || byObj.StorePath != pathA {
			t.Fatalf("by object: %+v, %v", byObj, err)
		}
		list, err := db.ListCachePaths(ctx, c.ID)
		if err != nil || len(list) != 1 {
			t.Fatalf("list: %v, %v", list, err)
		}
		key, inUse, err := db.DeleteCachePath(ctx, c.ID, "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr")
		if err != nil || key != p.ObjectKey || !inUse {
			t.Fatalf("delete: %q %v %v (the other cache still uses the object)", key, inUse, err)
		}
		if _, err := db.CachePath(ctx, c.ID, "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr"); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		if _, inUse, err = db.DeleteCachePath(ctx, other.ID, "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr"); err != nil || inUse {
			t.Fatalf("last delete: in use %v, %v", inUse, err)
		}

		// What a narinfo is signed from is checked by Nix's rules here too.
		for name, spoil := range map[string]func(*storage.CachePath){
			"short hash":      func(p *storage.CachePath) { p.StorePath = "/nix/store/short-hello" },
			"name charset":    func(p *storage.CachePath) { p.StorePath = "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-a b;c" },
			"name length":     func(p *storage.CachePath) { p.StorePath = pathA + strings.Repeat("x", 300) },
			"base name":       func(p *storage.CachePath) { p.StorePath = "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-hello" },
			"CA grammar":      func(p *storage.CachePath) { p.CA = "garbage ca value: with Sig: fake" },
			"reference":       func(p *storage.CachePath) { p.References = []string{pathB + "\nSig: fake"} },
			"deriver charset": func(p *storage.CachePath) { p.Deriver = drvA + " x" },
		} {
			bad := samplePath(c.ID)
			bad.StorePath = "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-fresh"
			spoil(&bad)
			if _, _, err := db.PutCachePath(ctx, bad); !errors.Is(err, storage.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", name, err)
			}
		}
		// Deleting the cache deletes its paths.
		db.PutCachePath(ctx, samplePath(c.ID))
		if err := db.DeleteCache(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
		if list, _ := db.ListCachePaths(ctx, c.ID); len(list) != 0 {
			t.Fatalf("paths outlived their cache: %v", list)
		}
	})
}

func TestCacheKeys(t *testing.T) {
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		c, _ := db.CreateCache(ctx, storage.NewCache{Name: "private"})
		k, text, err := db.CreateCacheKey(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		token, ok := strings.CutPrefix(text, storage.CacheKeyPrefix)
		if !ok || len(token) < 43 { // at least 256 random bits in base64url
			t.Fatalf("key %q", text)
		}
		if got, err := db.CacheKeyByToken(ctx, c.ID, token); err != nil || got.ID != k.ID {
			t.Fatalf("lookup of the key: %+v, %v", got, err)
		}
		other, _ := db.CreateCache(ctx, storage.NewCache{Name: "other"})
		for name, lookup := range map[string]func() error{
			"wrong token":     func() error { _, err := db.CacheKeyByToken(ctx, c.ID, token[:len(token)-1]+"x"); return err },
			"another cache":   func() error { _, err := db.CacheKeyByToken(ctx, other.ID, token); return err },
			"with the prefix": func() error { _, err := db.CacheKeyByToken(ctx, c.ID, text); return err },
		} {
			if err := lookup(); !errors.Is(err, storage.ErrNotFound) {
				t.Errorf("%s: %v, want ErrNotFound", name, err)
			}
		}
		keys, err := db.CacheKeys(ctx, c.ID)
		if err != nil || len(keys) != 1 || keys[0].ID != k.ID {
			t.Fatalf("keys: %v, %v", keys, err)
		}
		if err := db.DeleteCacheKey(ctx, c.ID, k.ID); err != nil {
			t.Fatal(err)
		}
		if keys, _ := db.CacheKeys(ctx, c.ID); len(keys) != 0 {
			t.Fatalf("keys after delete: %v", keys)
		}
		if _, err := db.CacheKeyByToken(ctx, c.ID, token); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("deleted key still found: %v", err)
		}
	})
}
