package retention_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/server/retention"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// The same ordering on an S3 store: an upload racing the deletion of its
// object is never lost (docs/protocol/cache.md §10.1), and a collection
// removes an orphan object from the bucket.
func TestS3UploadRacingObjectDeletionIsNeverLost(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		srv := s3test.Start(t)
		store, err := s3store.Open(t.Context(), s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, PathStyle: true,
			AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: t.TempDir()}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		w := newWorld(t, db)
		db.SetObjectCheck(func(ctx context.Context, key string) error {
			if _, err := store.Stat(ctx, key); errors.Is(err, narstore.ErrNotFound) {
				return storage.ErrObjectMissing
			} else {
				return err
			}
		})
		ctx := context.Background()
		del := func(ctx context.Context, key string) error {
			if err := store.Delete(ctx, key); err != nil && !errors.Is(err, narstore.ErrNotFound) {
				return err
			}
			return nil
		}
		has := func(key string) bool { _, err := store.Stat(ctx, key); return err == nil }
		for i := range 15 {
			content := fmt.Sprintf("racing on s3 %d", i)
			path := w.path("race")
			obj, err := store.Put(ctx, strings.NewReader(content), nil)
			if err != nil {
				t.Fatal(err)
			}
			p := w.record(w.cache, path, obj, nil, false, time.Time{})
			if _, _, err := db.DeleteCachePath(ctx, w.cache.ID, mustHash(t, path)); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var uploadErr error
			wg.Go(func() {
				if _, err := db.DeleteQueuedObjects(ctx, nil, 10, del); err != nil {
					t.Error(err)
				}
			})
			wg.Go(func() {
				for range 5 {
					obj, err := store.Put(ctx, strings.NewReader(content), nil)
					if err != nil {
						uploadErr = err
						return
					}
					_, _, err = db.PutCachePath(ctx, storage.CachePath{CacheID: w.cache.ID, StorePath: path,
						NarHash: obj.NarHashText(), NarSize: obj.NarSize, FileHash: obj.FileHashText(), FileSize: obj.FileSize,
						Compression: narstore.Compression, ObjectKey: obj.Key})
					if uploadErr = err; !errors.Is(err, storage.ErrObjectMissing) {
						return
					}
				}
			})
			wg.Wait()
			if uploadErr != nil {
				t.Fatalf("round %d: upload: %v", i, uploadErr)
			}
			if !has(p.ObjectKey) {
				t.Fatalf("round %d: the upload committed its row but the collection deleted its NAR", i)
			}
		}

		// An object no row references, older than the grace period, goes.
		orphan, err := store.Put(ctx, strings.NewReader("orphan on s3"), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := retention.New(retention.Config{DB: db, Store: store, Grace: time.Nanosecond})
		if _, err := c.Run(ctx, false); err != nil {
			t.Fatal(err)
		}
		if has(orphan.Key) {
			t.Fatal("the orphan object is still in the bucket")
		}
	})
}
