package cache_test

import (
	"crypto/sha256"
	"strconv"
	"strings"
	"testing"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

const validStorePath = "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob"

// badMetadata are the values and their kin, each with what the
// refusal must name.
var badMetadata = []struct {
	name, storePath, reference, deriver, ca, reason string
}{
	{name: "name charset", storePath: "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-a b;c", reason: "character ' '"},
	{name: "name length", storePath: "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-" + strings.Repeat("n", 300), reason: "Nix allows 211"},
	{name: "dot name", storePath: "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-.x", reason: "starts with '.'"},
	{name: "hash part", storePath: "/nix/store/eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee-x", reason: "not nix32"},
	{name: "CA grammar", ca: "garbage ca value: with Sig: fake", reason: "CA"},
	{name: "CA newline", ca: "fixed:r:sha256:" + strings.Repeat("0", 52) + "\nSig: fake", reason: "CA"},
	{name: "reference", reference: "0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-x\nSig: fake", reason: "reference"},
	{name: "deriver", deriver: "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-a;b.drv", reason: "deriver"},
}

// The admin push refuses bad store paths, references, derivers and CA
// fields with 400 and a reason, before anything is stored or signed.
func TestAdminPushRefusesBadMetadata(t *testing.T) {
	t.Parallel()
	e := newCacheEnv(t, server.Config{})
	nar := []byte("a NAR")
	sum := sha256.Sum256(nar)
	for _, c := range badMetadata {
		path := c.storePath
		if path == "" {
			path = validStorePath
		}
		headers := map[string]string{admin.HeaderStorePath: path, admin.HeaderNarHash: "sha256:" + nixbase32.Encode(sum[:]),
			admin.HeaderNarSize: strconv.Itoa(len(nar)), admin.HeaderReferences: c.reference, admin.HeaderDeriver: c.deriver, admin.HeaderCA: c.ca}
		if strings.Contains(c.reference+c.ca, "\n") {
			// HTTP cannot carry a line break in a header: the worker
			// upload test below covers these.
			continue
		}
		status, body := e.uploadWith("main", nar, headers)
		if status != 400 || !strings.Contains(string(body), c.reason) {
			t.Errorf("%s: %d %s, want 400 naming %q", c.name, status, body, c.reason)
		}
	}
	if paths, err := e.db.ListCachePaths(t.Context(), e.cache.ID); err != nil || len(paths) != 0 {
		t.Fatalf("paths recorded: %v, %v", paths, err)
	}
	if keys, err := e.store.(*narstore.Local).Keys(); err != nil || len(keys) != 0 {
		t.Fatalf("objects stored: %v, %v", keys, err)
	}
	// The same push with good values goes through.
	headers := map[string]string{admin.HeaderStorePath: validStorePath, admin.HeaderNarHash: "sha256:" + nixbase32.Encode(sum[:]),
		admin.HeaderNarSize: strconv.Itoa(len(nar)), admin.HeaderCA: "fixed:r:sha256:" + strings.Repeat("0", 52)}
	if status, body := e.uploadWith("main", nar, headers); status != 201 {
		t.Fatalf("good push: %d %s", status, body)
	}
}

// Worker uploads (NarUploadMetadata, UploadRequest) are held to the same
// rules: Rejected with the reason, nothing recorded or kept.
func TestWorkerUploadRefusesBadMetadata(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		w := e.projectWorker()
		for i, c := range badMetadata {
			up := compressNar(t, randomNar(5000))
			path := c.storePath
			if path == "" {
				path = testStorePath("bad")
			}
			e.produce(path)
			if c.reference != "" {
				up.meta.References = []string{c.reference}
			}
			if c.deriver != "" {
				up.meta.Deriver = &c.deriver
			}
			if c.ca != "" {
				up.meta.CA = &c.ca
			}
			_, out := uploadNar(t, w.Sess, uint64(i+1), path, up)
			if r, ok := out.(*wire.UploadRejected); !ok || !strings.Contains(r.Reason, c.reason) {
				t.Errorf("%s: outcome %+v, want Rejected naming %q", c.name, out, c.reason)
			}
			if hash, err := storage.StorePathHash(path); err == nil {
				if _, err := db.CachePath(t.Context(), e.Cache.ID, hash); err == nil {
					t.Errorf("%s: the path was recorded", c.name)
				}
			}
		}
		if keys, err := e.store.Keys(); err != nil || len(keys) != 0 {
			t.Fatalf("objects kept: %v %v", keys, err)
		}
	})
}
