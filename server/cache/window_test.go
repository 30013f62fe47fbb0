package cache_test

import (
	"crypto/sha256"
	"strings"
	"testing"

	"gradient.dev/gradient/internal/zstdbound/zstdboundtest"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// A worker uploading a valid frame that declares a 256 MiB window (the
// decoder library's default would allow 512 MiB) gets Rejected with the
// reason, and nothing is recorded.
func TestUploadRejectsAWindowBeyondTheBound(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		w := e.projectWorker()
		nar := randomNar(100 << 10)
		zst := zstdboundtest.WithWindowLog(28, nar)
		fileSum, narSum := sha256.Sum256(zst), sha256.Sum256(nar)
		c := compressed{zst: zst, meta: wire.NarUploadMetadata{
			FileHash: "sha256:" + nixbase32.Encode(fileSum[:]), FileSize: uint64(len(zst)),
			NarHash: "sha256:" + nixbase32.Encode(narSum[:]), NarSize: uint64(len(nar)), References: []string{},
		}}
		path := testStorePath("wide")
		e.produce(path)
		_, out := uploadNar(t, w.Sess, 1, path, c)
		if r, rejected := out.(*wire.UploadRejected); !rejected || !strings.Contains(r.Reason, "zstd") {
			t.Fatalf("outcome %+v, want Rejected naming the zstd stream", out)
		}
		hash, _ := storage.StorePathHash(path)
		if _, err := db.CachePath(t.Context(), e.Cache.ID, hash); err == nil {
			t.Fatal("the path was recorded")
		}
	})
}
