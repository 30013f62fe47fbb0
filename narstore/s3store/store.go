// Package s3store keeps NAR objects in an S3-compatible bucket: the
// narstore.Store of a server whose NARs do not live on its own disk, and a
// narstore.Presigner, so workers upload and download them directly through
// presigned URLs (docs/protocol/cache.md §4.5).
//
// Keys: <prefix>nars/<nix32 file hash>.nar.zst for objects (as narstore.Local
// keys them), <prefix>incoming/<random>.nar.zst for presigned uploads not yet
// verified. An object appears under its key only once verified: a server-side
// put or a relayed upload is staged in a local file, checked and then
// uploaded to its key; a presigned upload is read back once from its staging
// key and copied to its key. Sweep removes what a crash or an abandoned
// grant left in incoming/ and aborts stale multipart uploads.
package s3store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/narstore"
)

// Store is an S3-backed narstore.Store and narstore.Presigner.
type Store struct {
	cfg     Config
	client  *s3.Client
	presign *s3.PresignClient
	log     *slog.Logger
	// minPart lets tests use parts below the protocol's 64 MiB.
	minPart int64
	// swept counts what sweeps removed (kind multipart or incoming),
	// sweepFailures the sweeps that failed.
	swept         *prometheus.CounterVec
	sweepFailures prometheus.Counter
}

// Collectors are the store's metrics, for the binary's registry.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.swept, s.sweepFailures}
}

var (
	_ narstore.Store     = (*Store)(nil)
	_ narstore.Presigner = (*Store)(nil)
)

// Open connects to the bucket and checks that it answers.
func Open(ctx context.Context, cfg Config, httpClient *http.Client, log *slog.Logger) (*Store, error) {
	if err := cfg.normalise(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if httpClient == nil {
		httpClient = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
	opts := func(endpoint string) s3.Options {
		o := s3.Options{
			Region:       cfg.Region,
			Credentials:  credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken),
			UsePathStyle: cfg.PathStyle,
			HTTPClient:   httpClient,
			// Only the checksums S3 requires: a presigned PUT must not
			// carry a checksum of an empty body, and S3-compatible stores
			// differ in which optional checksums they know.
			RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
			ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		}
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
		return o
	}
	s := &Store{cfg: cfg, client: s3.New(opts(cfg.Endpoint)), log: log, minPart: DefaultPartSize,
		swept: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_nar_store_swept_total", Help: "Abandoned uploads the S3 NAR store's sweep removed, by kind (multipart, incoming).",
		}, []string{"kind"}),
		sweepFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_nar_store_sweep_failures_total", Help: "Sweeps of the S3 NAR store that failed (the next one tries again).",
		}),
	}
	presignFrom := s.client
	if cfg.PresignEndpoint != "" {
		presignFrom = s3.New(opts(cfg.PresignEndpoint))
	}
	s.presign = s3.NewPresignClient(presignFrom, s3.WithPresignExpires(cfg.PresignTTL))
	// Staging files a crashed server left behind: nothing else uses them.
	for _, pattern := range []string{".s3put-*.tmp", ".s3relay-*.tmp"} {
		leftovers, _ := filepath.Glob(filepath.Join(cfg.StagingDir, pattern))
		for _, name := range leftovers {
			os.Remove(name)
		}
	}
	if _, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(cfg.Bucket)}); err != nil {
		return nil, fmt.Errorf("s3 store: bucket %s: %w", cfg.Bucket, err)
	}
	if w := cfg.LocalOnlyWarning(); w != "" {
		log.Warn("s3 store: "+w, "store", cfg.String())
	}
	return s, nil
}

// MinPartSizeForTests lets presigned multipart uploads use parts down to
// S3's 5 MiB (the protocol's floor is 64 MiB), so tests stay small.
func (s *Store) MinPartSizeForTests(size int64) {
	s.minPart = max(size, s3MinPart)
	s.cfg.PartSize = s.minPart
}

// Warnings are configuration problems for the operator (gradient server
// status): presigned URLs that name a loopback or link-local address.
func (s *Store) Warnings() []string {
	if w := s.cfg.LocalOnlyWarning(); w != "" {
		return []string{"NAR store: " + w}
	}
	return nil
}

// Config is the store's configuration (credentials included: do not log).
func (s *Store) Config() Config { return s.cfg }

func (s *Store) objectKey(key string) string { return s.cfg.Prefix + "nars/" + key + ".nar.zst" }

func (s *Store) incomingPrefix() string { return s.cfg.Prefix + "incoming/" }

func (s *Store) stagingKey() string {
	var b [16]byte
	rand.Read(b[:])
	return s.incomingPrefix() + hex.EncodeToString(b[:]) + ".nar.zst"
}

// notFound reports whether err is S3's answer for a missing key.
func notFound(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsk) || errors.As(err, &nf) {
		return true
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "NoSuchKey", "NotFound", "NoSuchUpload":
			return true
		}
	}
	return false
}

// Put implements narstore.Store: the NAR is compressed into a local staging
// file (bounded memory, whatever its size), verified, and only then
// uploaded to its key.
func (s *Store) Put(ctx context.Context, nar io.Reader, verify func(narstore.Object) error) (narstore.Object, error) {
	f, err := os.CreateTemp(s.cfg.StagingDir, ".s3put-*.tmp")
	if err != nil {
		return narstore.Object{}, fmt.Errorf("s3 store: staging: %w", err)
	}
	defer func() { f.Close(); os.Remove(f.Name()) }()
	obj, err := narstore.Compress(ctx, f, nar)
	if err != nil {
		return narstore.Object{}, err
	}
	if verify != nil {
		if err := verify(obj); err != nil {
			return narstore.Object{}, err
		}
	}
	if err := s.upload(ctx, obj.Key, f, obj.FileSize); err != nil {
		return narstore.Object{}, err
	}
	return obj, nil
}

// upload sends size bytes of f to key: one PUT, or a multipart upload
// read part by part from the file when larger than a part.
func (s *Store) upload(ctx context.Context, key string, f *os.File, size int64) error {
	bucket, k := aws.String(s.cfg.Bucket), aws.String(s.objectKey(key))
	if size <= s.cfg.PartSize {
		_, err := s.client.PutObject(ctx, &s3.PutObjectInput{Bucket: bucket, Key: k,
			Body: io.NewSectionReader(f, 0, size), ContentLength: aws.Int64(size), ContentType: aws.String("application/x-nix-nar")})
		if err != nil {
			return fmt.Errorf("s3 store: put %s: %w", key, err)
		}
		return nil
	}
	mp, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: bucket, Key: k,
		ContentType: aws.String("application/x-nix-nar")})
	if err != nil {
		return fmt.Errorf("s3 store: put %s: %w", key, err)
	}
	abort := func() {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: bucket, Key: k, UploadId: mp.UploadId})
	}
	var parts []types.CompletedPart
	for off, n := int64(0), int32(1); off < size; off, n = off+s.cfg.PartSize, n+1 {
		length := min(s.cfg.PartSize, size-off)
		out, err := s.client.UploadPart(ctx, &s3.UploadPartInput{Bucket: bucket, Key: k, UploadId: mp.UploadId,
			PartNumber: aws.Int32(n), Body: io.NewSectionReader(f, off, length), ContentLength: aws.Int64(length)})
		if err != nil {
			abort()
			return fmt.Errorf("s3 store: put %s part %d: %w", key, n, err)
		}
		parts = append(parts, types.CompletedPart{PartNumber: aws.Int32(n), ETag: out.ETag})
	}
	_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: bucket, Key: k,
		UploadId: mp.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}})
	if err != nil {
		abort()
		return fmt.Errorf("s3 store: put %s: %w", key, err)
	}
	return nil
}

// Open implements narstore.Store. The reader seeks (a ranged GET from the
// new offset), so resumed pulls and HTTP range requests need no reread.
func (s *Store) Open(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	if !narstore.ValidKey(key) {
		return nil, 0, narstore.ErrNotFound
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.objectKey(key))})
	if notFound(err) {
		return nil, 0, narstore.ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("s3 store: get %s: %w", key, err)
	}
	size := aws.ToInt64(out.ContentLength)
	return &objectReader{s: s, ctx: ctx, key: key, size: size, body: out.Body}, size, nil
}

// objectReader reads an object and seeks with ranged GETs. A seek only
// moves the offset: the open body is replaced on the next read, and only
// when it is elsewhere (http.ServeContent seeks to the end and back before
// reading, which must not cost a second request).
type objectReader struct {
	s      *Store
	ctx    context.Context
	key    string
	size   int64
	off    int64
	body   io.ReadCloser
	bodyAt int64 // where body's next byte is
}

func (r *objectReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	if r.body != nil && r.bodyAt != r.off {
		r.body.Close()
		r.body = nil
	}
	if r.body == nil {
		out, err := r.s.client.GetObject(r.ctx, &s3.GetObjectInput{Bucket: aws.String(r.s.cfg.Bucket),
			Key: aws.String(r.s.objectKey(r.key)), Range: aws.String(fmt.Sprintf("bytes=%d-", r.off))})
		if err != nil {
			return 0, fmt.Errorf("s3 store: get %s at %d: %w", r.key, r.off, err)
		}
		r.body, r.bodyAt = out.Body, r.off
	}
	n, err := r.body.Read(p)
	r.off += int64(n)
	r.bodyAt += int64(n)
	if err == io.EOF && r.off < r.size {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (r *objectReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.size
	}
	if offset < 0 {
		return 0, errors.New("s3 store: seek before the start")
	}
	r.off = offset
	return offset, nil
}

func (r *objectReader) Close() error {
	if r.body != nil {
		return r.body.Close()
	}
	return nil
}

// Delete implements narstore.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if !narstore.ValidKey(key) {
		return narstore.ErrNotFound
	}
	k := aws.String(s.objectKey(key))
	if _, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: k}); err != nil {
		if notFound(err) {
			return narstore.ErrNotFound
		}
		return fmt.Errorf("s3 store: delete %s: %w", key, err)
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: k}); err != nil {
		return fmt.Errorf("s3 store: delete %s: %w", key, err)
	}
	return nil
}

// Stat implements narstore.Store. ModTime is the object's LastModified:
// when it was first placed (an equal object uploaded again is not copied
// over it).
func (s *Store) Stat(ctx context.Context, key string) (narstore.ObjectInfo, error) {
	if !narstore.ValidKey(key) {
		return narstore.ObjectInfo{}, narstore.ErrNotFound
	}
	head, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.objectKey(key))})
	if notFound(err) {
		return narstore.ObjectInfo{}, narstore.ErrNotFound
	}
	if err != nil {
		return narstore.ObjectInfo{}, fmt.Errorf("s3 store: stat %s: %w", key, err)
	}
	return narstore.ObjectInfo{Key: key, Size: aws.ToInt64(head.ContentLength), ModTime: aws.ToTime(head.LastModified)}, nil
}

// Walk implements narstore.Store: one listing page (up to 1000 objects)
// in memory at a time; incoming uploads are not objects.
func (s *Store) Walk(ctx context.Context, fn func(narstore.ObjectInfo) error) error {
	prefix := s.cfg.Prefix + "nars/"
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("s3 store: list: %w", err)
		}
		for _, o := range page.Contents {
			k, ok := strings.CutSuffix(strings.TrimPrefix(aws.ToString(o.Key), prefix), ".nar.zst")
			if !ok || !narstore.ValidKey(k) {
				continue
			}
			if err := fn(narstore.ObjectInfo{Key: k, Size: aws.ToInt64(o.Size), ModTime: aws.ToTime(o.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// Keys lists the stored objects' keys (incoming uploads excluded).
func (s *Store) Keys(ctx context.Context) ([]string, error) {
	var keys []string
	prefix := s.cfg.Prefix + "nars/"
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("s3 store: list: %w", err)
		}
		for _, o := range page.Contents {
			k, ok := strings.CutSuffix(strings.TrimPrefix(aws.ToString(o.Key), prefix), ".nar.zst")
			if ok && narstore.ValidKey(k) {
				keys = append(keys, k)
			}
		}
	}
	return keys, nil
}
