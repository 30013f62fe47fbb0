package s3store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"gradient.dev/gradient/narstore"
)

// maxPresignedParts bounds the part URLs of one grant (and so the grant's
// size on the wire): larger objects get larger parts.
const maxPresignedParts = 1000

// copyMax is the largest object one CopyObject may copy.
const copyMax = 5 << 30

// PresignGet implements narstore.Presigner.
func (s *Store) PresignGet(ctx context.Context, key string) (string, error) {
	if !narstore.ValidKey(key) {
		return "", narstore.ErrNotFound
	}
	req, err := s.presign.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.objectKey(key))})
	if err != nil {
		return "", fmt.Errorf("s3 store: presign get: %w", err)
	}
	return req.URL, nil
}

// PresignUpload implements narstore.Presigner. The staging key is random,
// so nothing a worker sends can land under an object's key.
func (s *Store) PresignUpload(ctx context.Context, limit int64, multipart bool) (narstore.PresignedUpload, error) {
	u := &presignedUpload{s: s, key: s.stagingKey(), limit: limit, expires: time.Now().Add(s.cfg.PresignTTL)}
	bucket, key := aws.String(s.cfg.Bucket), aws.String(u.key)
	if !multipart {
		req, err := s.presign.PresignPutObject(ctx, &s3.PutObjectInput{Bucket: bucket, Key: key})
		if err != nil {
			return nil, fmt.Errorf("s3 store: presign put: %w", err)
		}
		u.urls = []string{req.URL}
		return u, nil
	}
	u.partSize = max(s.cfg.PartSize, s.minPart)
	if per := (limit + maxPresignedParts - 1) / maxPresignedParts; per > u.partSize {
		u.partSize = (per + 1<<20 - 1) &^ (1<<20 - 1)
	}
	parts := max(1, (limit+u.partSize-1)/u.partSize)
	mp, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: bucket, Key: key,
		ContentType: aws.String("application/x-nix-nar")})
	if err != nil {
		return nil, fmt.Errorf("s3 store: start multipart upload: %w", err)
	}
	u.uploadID = aws.ToString(mp.UploadId)
	for n := int32(1); int64(n) <= parts; n++ {
		req, err := s.presign.PresignUploadPart(ctx, &s3.UploadPartInput{Bucket: bucket, Key: key,
			UploadId: mp.UploadId, PartNumber: aws.Int32(n)})
		if err != nil {
			u.Abort()
			return nil, fmt.Errorf("s3 store: presign part: %w", err)
		}
		u.urls = append(u.urls, req.URL)
	}
	return u, nil
}

type presignedUpload struct {
	s        *Store
	key      string // staging key
	limit    int64
	uploadID string
	partSize int64
	urls     []string
	expires  time.Time
	done     bool
}

func (u *presignedUpload) URLs() []string     { return u.urls }
func (u *presignedUpload) UploadID() string   { return u.uploadID }
func (u *presignedUpload) PartSize() int64    { return u.partSize }
func (u *presignedUpload) Expires() time.Time { return u.expires }

// refused reports whether the store refused a request as the client's
// fault (4xx): parts missing or too small, a wrong ETag, a changed object.
func refused(err error) bool {
	var re *awshttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() >= 400 && re.HTTPStatusCode() < 500
}

func (u *presignedUpload) Commit(ctx context.Context, etags []string, fileSize int64, inspect io.Writer, verify func(narstore.Object) error) (narstore.Object, error) {
	if u.done {
		return narstore.Object{}, errors.New("s3 store: upload already finished")
	}
	defer u.Abort()
	s := u.s
	bucket, key := aws.String(s.cfg.Bucket), aws.String(u.key)
	if fileSize > u.limit {
		return narstore.Object{}, fmt.Errorf("%w: %d bytes is more than the announced size allows", narstore.ErrMismatch, fileSize)
	}
	if u.uploadID != "" {
		if len(etags) == 0 || len(etags) > len(u.urls) {
			return narstore.Object{}, fmt.Errorf("%w: %d part ETags for %d part URLs", narstore.ErrMismatch, len(etags), len(u.urls))
		}
		parts := make([]types.CompletedPart, len(etags))
		for i, e := range etags {
			parts[i] = types.CompletedPart{PartNumber: aws.Int32(int32(i + 1)), ETag: aws.String(e)}
		}
		_, err := s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: bucket, Key: key,
			UploadId: aws.String(u.uploadID), MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}})
		if notFound(err) || refused(err) {
			return narstore.Object{}, fmt.Errorf("%w: completing the multipart upload: %v", narstore.ErrMismatch, err)
		}
		if err != nil {
			return narstore.Object{}, fmt.Errorf("s3 store: complete multipart upload: %w", err)
		}
		u.uploadID = "" // completed: Abort deletes the object instead
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: bucket, Key: key})
	if notFound(err) {
		return narstore.Object{}, fmt.Errorf("%w: nothing was uploaded", narstore.ErrMismatch)
	}
	if err != nil {
		return narstore.Object{}, fmt.Errorf("s3 store: read back: %w", err)
	}
	defer out.Body.Close()
	if size := aws.ToInt64(out.ContentLength); size != fileSize {
		return narstore.Object{}, fmt.Errorf("%w: %d bytes uploaded, file_size says %d", narstore.ErrMismatch, size, fileSize)
	}
	obj, err := narstore.Sums(ctx, io.LimitReader(out.Body, fileSize), inspect)
	if err != nil {
		return narstore.Object{}, err
	}
	if verify != nil {
		if err := verify(obj); err != nil {
			return narstore.Object{}, err
		}
	}
	// The URL stays valid after the worker finished: copy only the bytes
	// just verified (If-Match on their ETag), never a later overwrite.
	if err := s.place(ctx, u.key, aws.ToString(out.ETag), obj); err != nil {
		return narstore.Object{}, err
	}
	return obj, nil
}

// place copies the verified staging object to its key, unless an equal
// object is there already.
func (s *Store) place(ctx context.Context, staging, etag string, obj narstore.Object) error {
	bucket, dst := aws.String(s.cfg.Bucket), aws.String(s.objectKey(obj.Key))
	if head, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: bucket, Key: dst}); err == nil &&
		aws.ToInt64(head.ContentLength) == obj.FileSize {
		return nil // same file hash: same bytes
	}
	src := aws.String(s.cfg.Bucket + "/" + staging)
	var ifMatch *string
	if etag != "" {
		ifMatch = aws.String(etag)
	}
	if obj.FileSize <= copyMax {
		_, err := s.client.CopyObject(ctx, &s3.CopyObjectInput{Bucket: bucket, Key: dst, CopySource: src,
			CopySourceIfMatch: ifMatch, ContentType: aws.String("application/x-nix-nar"), MetadataDirective: types.MetadataDirectiveReplace})
		if refused(err) {
			return fmt.Errorf("%w: the uploaded object changed while it was verified: %v", narstore.ErrMismatch, err)
		}
		if err != nil {
			return fmt.Errorf("s3 store: copy into place: %w", err)
		}
		return nil
	}
	mp, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: bucket, Key: dst,
		ContentType: aws.String("application/x-nix-nar")})
	if err != nil {
		return fmt.Errorf("s3 store: copy into place: %w", err)
	}
	abort := func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: bucket, Key: dst, UploadId: mp.UploadId})
	}
	const part = 1 << 30
	var parts []types.CompletedPart
	for off, n := int64(0), int32(1); off < obj.FileSize; off, n = off+part, n+1 {
		end := min(off+part, obj.FileSize) - 1
		out, err := s.client.UploadPartCopy(ctx, &s3.UploadPartCopyInput{Bucket: bucket, Key: dst, UploadId: mp.UploadId,
			PartNumber: aws.Int32(n), CopySource: src, CopySourceIfMatch: ifMatch,
			CopySourceRange: aws.String(fmt.Sprintf("bytes=%d-%d", off, end))})
		if err != nil {
			abort()
			if refused(err) {
				return fmt.Errorf("%w: the uploaded object changed while it was verified: %v", narstore.ErrMismatch, err)
			}
			return fmt.Errorf("s3 store: copy into place: %w", err)
		}
		parts = append(parts, types.CompletedPart{PartNumber: aws.Int32(n), ETag: out.CopyPartResult.ETag})
	}
	if _, err := s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: bucket, Key: dst,
		UploadId: mp.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		abort()
		return fmt.Errorf("s3 store: copy into place: %w", err)
	}
	return nil
}

// Abort deletes the staging object (or aborts the multipart upload). If
// the store is unreachable, Sweep removes them later.
func (u *presignedUpload) Abort() {
	if u.done {
		return
	}
	u.done = true
	s := u.s
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bucket, key := aws.String(s.cfg.Bucket), aws.String(u.key)
	if u.uploadID != "" {
		s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: bucket, Key: key, UploadId: aws.String(u.uploadID)})
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: bucket, Key: key}); err != nil && !notFound(err) {
		s.log.Warn("s3 store: could not delete an unverified upload (the sweep will)", "key", u.key, "error", err)
	}
}
