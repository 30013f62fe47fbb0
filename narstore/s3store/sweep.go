package s3store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// ownPutLifetime is how long the server's own multipart uploads (to nars/)
// may run before the sweep takes them for a crash's leftovers.
const ownPutLifetime = 24 * time.Hour

// SweepResult counts what a sweep removed.
type SweepResult struct {
	AbortedMultipart int // incomplete multipart uploads aborted
	DeletedIncoming  int // unverified presigned uploads deleted
}

// Sweep removes what abandoned uploads left behind: multipart uploads
// under the prefix started more than lifetime ago (24 h for the server's
// own uploads to nars/), and objects in incoming/ older than lifetime.
// lifetime should exceed the URLs' (the default is twice the URL TTL), so
// no upload a worker may still finish is touched.
func (s *Store) Sweep(ctx context.Context, lifetime time.Duration) (SweepResult, error) {
	var res SweepResult
	if lifetime <= 0 {
		lifetime = 2 * s.cfg.PresignTTL
	}
	now := time.Now()
	bucket := aws.String(s.cfg.Bucket)
	in := &s3.ListMultipartUploadsInput{Bucket: bucket, Prefix: aws.String(s.cfg.Prefix)}
	for {
		page, err := s.client.ListMultipartUploads(ctx, in)
		if err != nil {
			return res, fmt.Errorf("s3 store: list multipart uploads: %w", err)
		}
		for _, up := range page.Uploads {
			key := aws.ToString(up.Key)
			limit := lifetime
			if !strings.HasPrefix(key, s.incomingPrefix()) {
				limit = max(limit, ownPutLifetime)
			}
			if up.Initiated == nil || now.Sub(*up.Initiated) < limit {
				continue
			}
			if _, err := s.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: bucket, Key: up.Key, UploadId: up.UploadId}); err != nil && !notFound(err) {
				return res, fmt.Errorf("s3 store: abort multipart upload: %w", err)
			}
			res.AbortedMultipart++
		}
		if !aws.ToBool(page.IsTruncated) {
			break
		}
		in.KeyMarker, in.UploadIdMarker = page.NextKeyMarker, page.NextUploadIdMarker
	}
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: bucket, Prefix: aws.String(s.incomingPrefix())})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return res, fmt.Errorf("s3 store: list incoming: %w", err)
		}
		for _, o := range page.Contents {
			if o.LastModified == nil || now.Sub(*o.LastModified) < lifetime {
				continue
			}
			if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: bucket, Key: o.Key}); err != nil && !notFound(err) {
				return res, fmt.Errorf("s3 store: delete stale upload: %w", err)
			}
			res.DeletedIncoming++
		}
	}
	return res, nil
}

// RunSweeper sweeps every interval until ctx ends, logging what it
// removed and any failure (the next round tries again).
func (s *Store) RunSweeper(ctx context.Context, interval, lifetime time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := s.Sweep(ctx, lifetime)
		s.swept.WithLabelValues("multipart").Add(float64(res.AbortedMultipart))
		s.swept.WithLabelValues("incoming").Add(float64(res.DeletedIncoming))
		switch {
		case err != nil && ctx.Err() == nil:
			s.sweepFailures.Inc()
			s.log.Warn("s3 store: sweep failed", "error", err)
		case res.AbortedMultipart+res.DeletedIncoming > 0:
			s.log.Info("s3 store: removed abandoned uploads", "multipart", res.AbortedMultipart, "incoming", res.DeletedIncoming)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
