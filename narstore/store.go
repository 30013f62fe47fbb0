// Package narstore keeps NAR objects: each NAR is stored zstd-compressed
// under a key derived from the SHA-256 of the compressed bytes (the
// narinfo's FileHash), so equal content is stored once. Backends implement
// Store; the local filesystem one is Local, and an S3-compatible one can
// follow behind the same interface.
package narstore

import (
	"context"
	"errors"
	"io"
	"time"

	"gradient.dev/gradient/nixbase32"
)

// ErrNotFound is returned by Open and Delete for a key the store lacks.
var ErrNotFound = errors.New("narstore: no such object")

// Store holds compressed NAR objects.
type Store interface {
	// Put reads an uncompressed NAR from nar until EOF, compresses it and
	// stores it. The object becomes visible only when Put returns nil;
	// after an error (a failing reader, a cancelled ctx, a crash, or
	// verify refusing the sums) nothing is visible. verify, if not nil,
	// sees the object's sums before it is committed.
	Put(ctx context.Context, nar io.Reader, verify func(Object) error) (Object, error)
	// Create starts an upload of an already-compressed object.
	Create(ctx context.Context) (Upload, error)
	// Open returns the compressed object and its size.
	Open(ctx context.Context, key string) (io.ReadCloser, int64, error)
	// Delete removes an object. Readers that opened it may finish.
	Delete(ctx context.Context, key string) error
	// Stat describes a stored object, or returns ErrNotFound.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// Walk calls fn for every stored object, in no particular order,
	// without holding them all in memory; fn's error ends the walk.
	Walk(ctx context.Context, fn func(ObjectInfo) error) error
}

// ObjectInfo is what Stat and Walk tell of a stored object. ModTime is
// when it was last written (garbage collection spares recent objects).
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// Object describes a stored NAR. Hashes are SHA-256 digests.
type Object struct {
	Key      string // nix32 of FileHash
	NarHash  [32]byte
	NarSize  int64
	FileHash [32]byte // of the compressed bytes
	FileSize int64
}

// NarHashText is the NAR hash as narinfo files write it: sha256:<nix32>.
func (o Object) NarHashText() string { return "sha256:" + nixbase32.Encode(o.NarHash[:]) }

// FileHashText is the compressed file's hash as narinfo files write it.
func (o Object) FileHashText() string { return "sha256:" + nixbase32.Encode(o.FileHash[:]) }

// Compression is the narinfo Compression value of every stored object.
const Compression = "zstd"

// KeyOf is the key of the object whose compressed bytes hash to fileHash.
func KeyOf(fileHash [32]byte) string { return nixbase32.Encode(fileHash[:]) }

// validKey reports whether key is a nix32 SHA-256, which keeps keys from
// naming paths outside the store.
func validKey(key string) bool {
	if len(key) != nixbase32.EncodedLen(32) {
		return false
	}
	_, err := nixbase32.Decode(key)
	return err == nil
}
