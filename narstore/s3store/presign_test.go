package s3store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/narstore/storetest"
)

// put sends body to a presigned URL as a worker does and returns the ETag.
func put(t *testing.T, url string, body []byte) (string, int) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-nix-nar")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Logf("PUT answered %d: %s", resp.StatusCode, msg)
	}
	return resp.Header.Get("ETag"), resp.StatusCode
}

func get(t *testing.T, url string) ([]byte, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return body, resp.StatusCode
}

// verifyAs refuses any object other than want, as the server's commit does.
func verifyAs(want []byte) func(narstore.Object) error {
	return func(o narstore.Object) error {
		if o.FileHash != sha256.Sum256(want) {
			return errors.New("file hash differs")
		}
		return nil
	}
}

// incoming lists the staging objects and unfinished uploads in the bucket.
func incoming(t *testing.T, srv *s3test.Server) []string {
	var left []string
	for _, k := range srv.Keys(t) {
		if !strings.HasPrefix(k, "gc/nars/") {
			left = append(left, k)
		}
	}
	return left
}

func TestPresignedPutAndGet(t *testing.T) {
	s, srv, _ := open(t)
	ctx := context.Background()
	nar := storetest.Payload(1, 2<<20)
	zst := storetest.Compressed(t, nar)
	up, err := s.PresignUpload(ctx, int64(len(nar))+1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(up.URLs()) != 1 || up.UploadID() != "" {
		t.Fatalf("single PUT grant has %d URLs, upload ID %q", len(up.URLs()), up.UploadID())
	}
	if _, code := put(t, up.URLs()[0], zst); code != http.StatusOK {
		t.Fatalf("presigned PUT answered %d", code)
	}
	keys, _ := s.Keys(ctx)
	if len(keys) != 0 {
		t.Fatalf("an unverified upload is visible: %q", keys)
	}
	var seen bytes.Buffer
	obj, err := up.Commit(ctx, nil, int64(len(zst)), &seen, verifyAs(zst))
	if err != nil {
		t.Fatal(err)
	}
	if obj.NarHash != sha256.Sum256(nar) || !bytes.Equal(seen.Bytes(), nar) {
		t.Fatal("commit learnt other NAR sums than uploaded")
	}
	if left := incoming(t, srv); len(left) != 0 {
		t.Fatalf("staging left behind: %q", left)
	}
	url, err := s.PresignGet(ctx, obj.Key)
	if err != nil {
		t.Fatal(err)
	}
	body, code := get(t, url)
	if code != http.StatusOK || !bytes.Equal(body, zst) {
		t.Fatalf("presigned GET answered %d with %d bytes", code, len(body))
	}
	// The URL is signed for that object only.
	if _, code := get(t, strings.Replace(url, obj.Key, strings.Repeat("0", len(obj.Key)), 1)); code == http.StatusOK {
		t.Fatal("a presigned GET URL reads another key")
	}
}

func TestPresignedMultipart(t *testing.T) {
	s, srv, _ := open(t)
	s.MinPartSizeForTests(5 << 20)
	ctx := context.Background()
	// Random bytes do not compress: 12 MiB of them are three parts.
	nar := make([]byte, 12<<20)
	rand.Read(nar)
	zst := storetest.Compressed(t, nar)
	limit := int64(len(nar) + len(nar)/128 + 1<<20)
	up, err := s.PresignUpload(ctx, limit, true)
	if err != nil {
		t.Fatal(err)
	}
	if up.UploadID() == "" || up.PartSize() != 5<<20 || int64(len(up.URLs())) != (limit+up.PartSize()-1)/up.PartSize() {
		t.Fatalf("multipart grant: id %q, part size %d, %d URLs for %d bytes", up.UploadID(), up.PartSize(), len(up.URLs()), limit)
	}
	var etags []string
	for i, part := range slices.Collect(slices.Chunk(zst, int(up.PartSize()))) {
		etag, code := put(t, up.URLs()[i], part)
		if code != http.StatusOK || etag == "" {
			t.Fatalf("part %d: %d, etag %q", i, code, etag)
		}
		etags = append(etags, etag)
	}
	if len(etags) != 3 {
		t.Fatalf("uploaded %d parts", len(etags))
	}
	obj, err := up.Commit(ctx, etags, int64(len(zst)), nil, verifyAs(zst))
	if err != nil {
		t.Fatal(err)
	}
	if got := storetest.ReadNAR(t, s, obj.Key); !bytes.Equal(got, nar) {
		t.Fatal("multipart object reads back wrong")
	}
	if left := incoming(t, srv); len(left) != 0 {
		t.Fatalf("staging left behind: %q", left)
	}
}

// A worker that uploads other bytes than it declares: refused, and nothing
// stays in the bucket.
func TestPresignedUploadRefusals(t *testing.T) {
	s, srv, _ := open(t)
	ctx := context.Background()
	declared := storetest.Compressed(t, storetest.Payload(1, 100<<10))
	other := storetest.Compressed(t, storetest.Payload(2, 100<<10))
	cases := []struct {
		name   string
		upload []byte // nil: upload nothing
		size   int64
		want   error
	}{
		{"other bytes", other, int64(len(other)), errors.New("file hash differs")},
		{"other size", declared, int64(len(declared)) - 1, narstore.ErrMismatch},
		{"nothing uploaded", nil, int64(len(declared)), narstore.ErrMismatch},
		{"not zstd", []byte("plain text, not a NAR"), 21, narstore.ErrCorrupt},
		{"beyond the limit", declared, 1 << 40, narstore.ErrMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up, err := s.PresignUpload(ctx, 1<<20, false)
			if err != nil {
				t.Fatal(err)
			}
			if c.upload != nil {
				put(t, up.URLs()[0], c.upload)
			}
			_, err = up.Commit(ctx, nil, c.size, nil, verifyAs(declared))
			if err == nil || (!errors.Is(err, c.want) && err.Error() != c.want.Error()) {
				t.Fatalf("Commit = %v, want %v", err, c.want)
			}
			if left := srv.Keys(t); len(left) != 0 {
				t.Fatalf("a refused upload left %q", left)
			}
		})
	}
}

// The URL stays valid after the worker reported the upload finished: bytes
// it sends after the server read the object back never reach the key.
func TestOverwriteDuringVerificationRefused(t *testing.T) {
	s, srv, _ := open(t)
	ctx := context.Background()
	good := storetest.Compressed(t, storetest.Payload(1, 100<<10))
	evil := storetest.Compressed(t, storetest.Payload(2, 100<<10))
	up, _ := s.PresignUpload(ctx, 1<<20, false)
	put(t, up.URLs()[0], good)
	_, err := up.Commit(ctx, nil, int64(len(good)), nil, func(o narstore.Object) error {
		put(t, up.URLs()[0], evil) // between the read-back and the copy
		return verifyAs(good)(o)
	})
	if !errors.Is(err, narstore.ErrMismatch) {
		t.Fatalf("Commit = %v, want ErrMismatch (the copy is conditional on the verified ETag)", err)
	}
	if left := srv.Keys(t); len(left) != 0 {
		t.Fatalf("left %q", left)
	}
}

func TestExpiredURLRefused(t *testing.T) {
	srv := s3test.Start(t)
	s, err := s3store.Open(context.Background(), s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Region: srv.Region,
		PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PresignTTL: time.Second}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	up, err := s.PresignUpload(context.Background(), 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	body := storetest.Compressed(t, storetest.Payload(1, 1000))
	waitfor.True(t, "the presigned URL to expire", func() bool {
		_, code := put(t, up.URLs()[0], body)
		return code == http.StatusForbidden
	})
	up.Abort()
	if left := srv.Keys(t); len(left) != 0 {
		t.Fatalf("left %q", left)
	}
}

// Uploads abandoned by a worker (or by a server that restarted between the
// grant and the finish) are removed by the sweep; objects are not.
func TestSweepRemovesAbandonedUploads(t *testing.T) {
	s, srv, _ := open(t)
	s.MinPartSizeForTests(5 << 20)
	ctx := context.Background()
	kept, err := s.Put(ctx, bytes.NewReader(storetest.Payload(9, 1000)), nil)
	if err != nil {
		t.Fatal(err)
	}
	single, _ := s.PresignUpload(ctx, 1<<20, false)
	put(t, single.URLs()[0], storetest.Compressed(t, storetest.Payload(1, 1000)))
	multi, _ := s.PresignUpload(ctx, 20<<20, true)
	put(t, multi.URLs()[0], make([]byte, 5<<20))
	// Younger than their lifetime: kept, a worker may still finish them.
	res, err := s.Sweep(ctx, time.Hour)
	if err != nil || res != (s3store.SweepResult{}) {
		t.Fatalf("sweep of fresh uploads = %+v, %v", res, err)
	}
	waitfor.True(t, "a sweep with a short lifetime to remove both", func() bool {
		res, err = s.Sweep(ctx, time.Millisecond)
		return err == nil && res.AbortedMultipart == 1 && res.DeletedIncoming == 1
	})
	if left := incoming(t, srv); len(left) != 0 {
		t.Fatalf("left %q", left)
	}
	if _, err := multi.Commit(ctx, []string{"x"}, 5<<20, nil, nil); !errors.Is(err, narstore.ErrMismatch) {
		t.Fatalf("commit of a swept multipart upload = %v", err)
	}
	if keys, _ := s.Keys(ctx); !slices.Equal(keys, []string{kept.Key}) {
		t.Fatalf("sweep touched objects: %q", keys)
	}
}

// The server's periodic sweep removes an abandoned upload and counts it.
func TestRunSweeperCounts(t *testing.T) {
	s, srv, _ := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	up, _ := s.PresignUpload(ctx, 1<<20, false)
	put(t, up.URLs()[0], storetest.Compressed(t, storetest.Payload(1, 1000)))
	go func() { s.RunSweeper(ctx, 20*time.Millisecond, time.Millisecond); close(done) }()
	swept := s.Collectors()[0].(*prometheus.CounterVec)
	waitfor.True(t, "the sweeper to remove the upload", func() bool {
		return testutil.ToFloat64(swept.WithLabelValues("incoming")) == 1 && len(srv.Keys(t)) == 0
	})
}
