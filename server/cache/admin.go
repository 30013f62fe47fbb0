package cache

import (
	"context"
	"errors"
	"fmt"
	"io"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/storage"
)

// The cache content the admin API manages: operators' pushes, signed
// narinfos of recorded paths, deletes.

// MismatchError is an upload whose bytes do not match its metadata;
// nothing was stored. Its kind is storage.ErrInvalid.
type MismatchError struct{ StorePath, Reason string }

func (e *MismatchError) Error() string { return "upload of " + e.StorePath + " refused: " + e.Reason }
func (e *MismatchError) Unwrap() error { return storage.ErrInvalid }

// errNarMismatch is an upload whose bytes do not match its metadata.
var errNarMismatch = errors.New("NAR does not match its metadata")

// HasNarStore reports whether NARs can be stored and served.
func (bc *Cache) HasNarStore() bool { return bc.cfg.NarStore != nil }

// PushPath stores an operator's upload of in (metadata checked by
// CheckPathMetadata, narHash its NAR hash) into cache from body, the
// uncompressed NAR; the hash and size are checked while storing and a
// mismatch (*MismatchError) stores nothing. A path the cache holds
// already is not read again: created is false.
//
// A push is a root of garbage collection (in.Pushed is set here) until
// the path is deleted or until in.ExpiresAt, when set; pushing a path the
// cache holds already makes it a root with the new time to live.
func (bc *Cache) PushPath(ctx context.Context, c storage.Cache, in storage.CachePath, narHash [32]byte, body io.Reader) (p storage.CachePath, created bool, err error) {
	store := bc.cfg.NarStore
	hash, _ := storage.StorePathHash(in.StorePath)
	in.Pushed = true
	if existing, err := bc.db.CachePath(ctx, c.ID, hash); err == nil {
		// Already stored: the body need not be read (idempotent put).
		if err := bc.db.SetCachePathPushed(ctx, c.ID, hash, in.ExpiresAt); err != nil {
			return p, false, err
		}
		return existing, false, nil
	}
	var mismatch string
	obj, err := store.Put(ctx, io.LimitReader(body, in.NarSize+1), func(o narstore.Object) error {
		switch {
		case o.NarSize != in.NarSize:
			mismatch = fmt.Sprintf("NAR is %d bytes, metadata says %d", o.NarSize, in.NarSize)
		case o.NarHash != narHash:
			mismatch = fmt.Sprintf("NAR hash is %s, metadata says %s", o.NarHashText(), in.NarHash)
		default:
			return nil
		}
		return errNarMismatch
	})
	if errors.Is(err, errNarMismatch) {
		bc.metrics.narUploads.WithLabelValues("mismatch").Inc()
		bc.log.Warn("admin: NAR upload refused", "cache", c.Name, "path", in.StorePath, "reason", mismatch)
		return p, false, &MismatchError{StorePath: in.StorePath, Reason: mismatch}
	}
	if err != nil {
		bc.metrics.narUploads.WithLabelValues("failed").Inc()
		return p, false, fmt.Errorf("store NAR of %s: %w", in.StorePath, err)
	}
	in.CacheID = c.ID
	in.NarHash = obj.NarHashText() // normalised to sha256:<nix32>
	in.FileHash, in.FileSize = obj.FileHashText(), obj.FileSize
	in.Compression, in.ObjectKey = narstore.Compression, obj.Key
	p, created, err = bc.db.PutCachePath(ctx, in)
	if err != nil {
		return p, false, err
	}
	bc.metrics.narUploads.WithLabelValues("stored").Inc()
	bc.log.Info("admin: path stored", "cache", c.Name, "path", p.StorePath, "nar_size", p.NarSize, "file_size", p.FileSize)
	return p, created, nil
}

// SignedNarinfo is the narinfo of p as the cache serves it.
func (bc *Cache) SignedNarinfo(ctx context.Context, p storage.CachePath) ([]byte, error) {
	key, err := bc.db.CacheSigningKey(ctx, p.CacheID)
	if err != nil {
		return nil, err
	}
	return renderNarinfo(p, key)
}

// DeletePath removes the path with store hash hash from cache, and its
// NAR object unless another cache still records it; storage.ErrNotFound
// when the cache has no such path.
func (bc *Cache) DeletePath(ctx context.Context, c storage.Cache, hash string) error {
	key, inUse, err := bc.db.DeleteCachePath(ctx, c.ID, hash)
	if err != nil {
		return err
	}
	bc.cacheMemo.forgetNarinfo(c.ID, hash)
	if store := bc.cfg.NarStore; !inUse && store != nil {
		// Queued with the row's deletion; deleted under the object's lock
		// (a queued object left behind goes with the next collection).
		_, err := bc.db.DeleteQueuedObjects(ctx, []string{key}, 1, func(ctx context.Context, key string) error {
			if err := store.Delete(ctx, key); err != nil && !errors.Is(err, narstore.ErrNotFound) {
				return err
			}
			return nil
		})
		if err != nil {
			bc.log.Warn("admin: NAR object not deleted", "object", key, "error", err)
		}
	}
	bc.log.Info("admin: path deleted", "cache", c.Name, "store_hash", hash)
	return nil
}

// Forget drops what the cache keeps of a deleted cache.
func (bc *Cache) Forget(c storage.Cache) {
	bc.cacheMemo.forgetCache(c)
	bc.subscriptions.forgetAll()
}
