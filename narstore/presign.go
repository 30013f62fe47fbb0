package narstore

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrMismatch is returned when an object uploaded through presigned URLs is
// not what the uploader declared (missing, another size, too large): the
// upload is refused, not retried.
var ErrMismatch = errors.New("narstore: object does not match its declaration")

// Presigner is a Store whose objects workers transfer directly, through
// presigned URLs (docs/protocol/cache.md §4.2, §2.1).
type Presigner interface {
	Store
	// PresignGet returns a URL that GETs the object of key until it
	// expires.
	PresignGet(ctx context.Context, key string) (string, error)
	// PresignUpload starts an upload of at most limit compressed bytes to
	// a staging key: one PUT URL, or with multipart, one URL per part.
	PresignUpload(ctx context.Context, limit int64, multipart bool) (PresignedUpload, error)
}

// PresignedUpload is an upload that a worker sends straight to the store.
// Nothing is visible until Commit succeeds.
type PresignedUpload interface {
	// URLs: one for a single PUT, one per part for a multipart upload.
	URLs() []string
	// UploadID is the multipart upload's ID, "" for a single PUT.
	UploadID() string
	// PartSize is the size of every part but the last (multipart only).
	PartSize() int64
	// Expires is when the URLs stop working.
	Expires() time.Time
	// Commit completes a multipart upload with the parts' ETags, checks
	// the object is fileSize bytes, reads it back to learn its sums
	// (passing the NAR to inspect), lets verify refuse them, and makes
	// the object visible under its key. An object that does not verify
	// is deleted.
	Commit(ctx context.Context, etags []string, fileSize int64, inspect io.Writer, verify func(Object) error) (Object, error)
	// Abort deletes what was uploaded; harmless after Commit or twice.
	Abort()
}
