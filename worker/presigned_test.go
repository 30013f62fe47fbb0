package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/internal/dialguard"
	"gradient.dev/gradient/internal/halfopen"
	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/narstore/storetest"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/wire"
)

// The worker's presigned transfers against a real S3 server (versitygw).
// The server's side of the protocol is scripted here (s3Peer): it presigns
// with the S3 store the server uses and commits what UploadFinished
// declares, so what is checked is what lands in the bucket.

func openS3(t testing.TB, opts ...func(*s3store.Config)) (*s3store.Store, *s3test.Server) {
	t.Helper()
	srv := s3test.Start(t)
	cfg := s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Region: srv.Region, PathStyle: true,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: t.TempDir()}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := s3store.Open(context.Background(), cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, srv
}

// s3Peer plays the server of a cache client's uploads over presigned URLs.
type s3Peer struct {
	t         *testing.T
	store     *s3store.Store
	c         *CacheClient
	multipart bool
	// target, when set, replaces request n's (1-based) grant.
	target func(n int, g wire.GrantTarget) wire.GrantTarget

	mu        sync.Mutex
	ups       map[uint64]narstore.PresignedUpload
	requests  int
	cancels   int
	finished  []*wire.NarUploadMetadata
	committed []narstore.Object
	refused   []error
}

func newS3Peer(t *testing.T, store *s3store.Store, multipart bool) *s3Peer {
	p := &s3Peer{t: t, store: store, multipart: multipart, ups: map[uint64]narstore.PresignedUpload{}}
	p.c = NewCacheClient(p.send)
	p.c.TempDir = t.TempDir()
	p.c.Log, _ = testlog.New(t, "presigned")
	p.c.PresignedRetryDelay = time.Millisecond
	return p
}

func (p *s3Peer) send(m wire.ClientMessage) error {
	ctx := context.Background()
	switch m := m.(type) {
	case *wire.UploadRequest:
		limit := int64(m.Size + m.Size/128 + 1<<20)
		up, err := p.store.PresignUpload(ctx, limit, p.multipart)
		if err != nil {
			p.t.Errorf("presign: %v", err)
			return err
		}
		var g wire.GrantTarget = &wire.GrantPut{URL: up.URLs()[0]}
		if p.multipart {
			g = &wire.PresignedMultipart{UploadID: up.UploadID(), PartSize: uint64(up.PartSize()), PartURLs: up.URLs()}
		}
		p.mu.Lock()
		p.requests++
		n := p.requests
		p.ups[m.RequestID] = up
		p.mu.Unlock()
		if p.target != nil {
			g = p.target(n, g)
		}
		p.c.HandleMessage(&wire.UploadGrant{RequestID: m.RequestID, Target: g})
	case *wire.UploadFinished:
		meta := m.Metadata.(*wire.NarUploadMetadata)
		p.mu.Lock()
		up := p.ups[m.RequestID]
		p.finished = append(p.finished, meta)
		p.mu.Unlock()
		go func() {
			var etags []string
			if meta.Multipart != nil {
				etags = meta.Multipart.ETags
			}
			obj, err := up.Commit(ctx, etags, int64(meta.FileSize), nil, func(o narstore.Object) error {
				if o.FileHashText() != meta.FileHash || o.NarHashText() != meta.NarHash || uint64(o.NarSize) != meta.NarSize {
					return errors.New("the object is not what UploadFinished declares")
				}
				return nil
			})
			var out wire.UploadOutcome = &wire.UploadOk{}
			p.mu.Lock()
			if err != nil {
				p.refused = append(p.refused, err)
				out = &wire.UploadRejected{Reason: err.Error()}
			} else {
				p.committed = append(p.committed, obj)
			}
			p.mu.Unlock()
			p.c.HandleMessage(&wire.UploadCommitted{RequestID: m.RequestID, Outcome: out})
		}()
	case *wire.UploadCancel:
		p.mu.Lock()
		p.cancels++
		up := p.ups[m.RequestID]
		p.mu.Unlock()
		if up != nil {
			up.Abort()
		}
	case *wire.UploadChunk:
		p.t.Errorf("an UploadChunk for a presigned grant")
	}
	return nil
}

// readObject is the compressed object of key as the bucket holds it.
func readObject(t *testing.T, s narstore.Store, key string) []byte {
	t.Helper()
	r, _, err := s.Open(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPresignedPutLandsByteIdentical(t *testing.T) {
	t.Parallel()
	store, _ := openS3(t)
	p := newS3Peer(t, store, false)
	var moved atomic.Int64
	p.c.PresignedMoved = func(download bool, n int) { moved.Add(int64(n)) }
	p.c.Moved = func(bool, int) { t.Error("presigned bytes counted as the session's") }
	nar := storetest.Payload(7, 3<<20)
	if err := p.c.Upload(context.Background(), "job", randomStorePath("put"), bytes.NewReader(nar), UploadMeta{}); err != nil {
		t.Fatal(err)
	}
	if len(p.committed) != 1 || p.cancels != 0 {
		t.Fatalf("committed %d objects, %d cancels", len(p.committed), p.cancels)
	}
	obj := p.committed[0]
	if got, want := readObject(t, store, obj.Key), storetest.Compressed(t, nar); !bytes.Equal(got, want) {
		t.Fatalf("the bucket holds %d bytes, not the %d compressed bytes the worker made", len(got), len(want))
	}
	if !bytes.Equal(storetest.ReadNAR(t, store, obj.Key), nar) {
		t.Fatal("the stored object does not decompress to the NAR")
	}
	if f := p.finished[0]; f.FileSize != uint64(obj.FileSize) || f.Multipart != nil {
		t.Fatalf("UploadFinished declared %d bytes (multipart %v), the object has %d", f.FileSize, f.Multipart, obj.FileSize)
	}
	if moved.Load() != obj.FileSize {
		t.Fatalf("PresignedMoved counted %d bytes, want %d", moved.Load(), obj.FileSize)
	}
}

func TestPresignedMultipartLandsByteIdentical(t *testing.T) {
	t.Parallel()
	store, _ := openS3(t)
	store.MinPartSizeForTests(5 << 20)
	p := newS3Peer(t, store, true)
	// Random bytes do not compress: 13 MiB are three parts of 5 MiB.
	nar := make([]byte, 13<<20)
	rand.Read(nar)
	if err := p.c.Upload(context.Background(), "job", randomStorePath("multi"), bytes.NewReader(nar), UploadMeta{}); err != nil {
		t.Fatal(err)
	}
	if len(p.committed) != 1 {
		t.Fatalf("committed %d objects (refused: %v)", len(p.committed), p.refused)
	}
	obj := p.committed[0]
	mp := p.finished[0].Multipart
	if want := (obj.FileSize + 5<<20 - 1) / (5 << 20); mp == nil || int64(len(mp.ETags)) != want || want < 2 {
		t.Fatalf("UploadFinished's multipart %+v for %d bytes, want %d ETags (at least 2)", mp, obj.FileSize, want)
	}
	if got, want := readObject(t, store, obj.Key), storetest.Compressed(t, nar); !bytes.Equal(got, want) {
		t.Fatalf("the bucket holds %d bytes, not the %d compressed bytes the worker made", len(got), len(want))
	}
}

// A grant whose URL fails (refused, expired) is cancelled and asked for
// again; the upload completes with the next grant. When every grant
// fails, the upload fails and no UploadFinished was ever sent.
func TestPresignedPutFailureCancelsAndAsksAgain(t *testing.T) {
	t.Parallel()
	store, srv := openS3(t)
	p := newS3Peer(t, store, false)
	// An address the dial guard refuses, then the store with the
	// signature broken (403, not retried), then a good URL.
	p.target = func(n int, g wire.GrantTarget) wire.GrantTarget {
		switch n {
		case 1:
			return &wire.GrantPut{URL: "http://169.254.169.254/latest/meta-data?X-Amz-Signature=secret"}
		case 2:
			u := g.(*wire.GrantPut).URL
			return &wire.GrantPut{URL: strings.Replace(u, "X-Amz-Signature=", "X-Amz-Signature=00", 1)}
		}
		return g
	}
	nar := storetest.Payload(11, 200<<10)
	if err := p.c.Upload(context.Background(), "job", randomStorePath("again"), bytes.NewReader(nar), UploadMeta{}); err != nil {
		t.Fatal(err)
	}
	if p.requests != 3 || p.cancels != 2 || len(p.finished) != 1 || len(p.committed) != 1 {
		t.Fatalf("%d requests, %d cancels, %d finished, %d committed; want 3, 2, 1, 1", p.requests, p.cancels, len(p.finished), len(p.committed))
	}
	if !bytes.Equal(storetest.ReadNAR(t, store, p.committed[0].Key), nar) {
		t.Fatal("the committed object is not the NAR")
	}
	if keys := srv.Keys(t); len(keys) != 1 {
		t.Fatalf("the bucket holds %q, want the one object", keys)
	}

	// Every grant broken: the upload fails, and nothing was declared finished.
	q := newS3Peer(t, store, false)
	q.target = func(n int, g wire.GrantTarget) wire.GrantTarget {
		return &wire.GrantPut{URL: strings.Replace(g.(*wire.GrantPut).URL, "X-Amz-Signature=", "X-Amz-Signature=00", 1)}
	}
	err := q.c.Upload(context.Background(), "job", randomStorePath("never"), bytes.NewReader(nar), UploadMeta{})
	if !errors.Is(err, ErrUploadRejected) || !strings.Contains(err.Error(), "403") {
		t.Fatalf("upload with broken grants: %v, want ErrUploadRejected naming the 403", err)
	}
	if strings.Contains(err.Error(), "X-Amz-Signature") || strings.Contains(err.Error(), "?") {
		t.Fatalf("the error repeats the URL's query: %v", err)
	}
	if q.requests != uploadAttempts || q.cancels != uploadAttempts || len(q.finished) != 0 {
		t.Fatalf("%d requests, %d cancels, %d finished; want %d, %d, 0", q.requests, q.cancels, len(q.finished), uploadAttempts, uploadAttempts)
	}
}

// storedObject puts nar into the store the normal way and presigns it.
func storedObject(t *testing.T, store *s3store.Store, nar []byte) (narstore.Object, string, []byte) {
	t.Helper()
	obj, err := store.Put(context.Background(), bytes.NewReader(nar), nil)
	if err != nil {
		t.Fatal(err)
	}
	u, err := store.PresignGet(context.Background(), obj.Key)
	if err != nil {
		t.Fatal(err)
	}
	return obj, u, readObject(t, store, obj.Key)
}

func TestOpenURLReadsTheObject(t *testing.T) {
	t.Parallel()
	store, _ := openS3(t)
	obj, u, want := storedObject(t, store, storetest.Payload(5, 1<<20))
	c := NewCacheClient(func(wire.ClientMessage) error { return nil })
	var events []string
	var mu sync.Mutex
	c.Presigned = func(op, outcome string) { mu.Lock(); events = append(events, op+" "+outcome); mu.Unlock() }
	size := uint64(obj.FileSize)
	r, err := c.OpenURL(context.Background(), u, &size)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want the %d stored", len(got), err, len(want))
	}
	if fmt.Sprint(events) != "[get ok]" {
		t.Fatalf("presigned events %v", events)
	}

	// The cache says another size: refused at the first answer.
	wrong := size + 1
	if _, err := c.OpenURL(context.Background(), u, &wrong); err == nil {
		t.Fatal("an object of another size than the cache says was opened")
	}
	// Missing object, not http(s), metadata address: refused, query never shown.
	missing := strings.Replace(u, obj.Key, strings.Repeat("0", len(obj.Key)), 1)
	for _, bad := range []string{missing, "file:///etc/passwd", "ftp://example.com/x", "http://169.254.169.254/x?X-Amz-Signature=s", "http://[fe80::1]/x"} {
		_, err := c.OpenURL(context.Background(), bad, &size)
		var pe *PresignedError
		if !errors.As(err, &pe) {
			t.Fatalf("OpenURL(%s): %v, want a *PresignedError", bad, err)
		}
		if strings.Contains(err.Error(), "X-Amz") {
			t.Fatalf("the error repeats the URL's query: %v", err)
		}
	}
}

// cutDialer dials the real address but ends the first connection after
// cutAfter bytes were read from it, as a network that broke mid-GET.
type cutDialer struct {
	cutAfter int64
	dials    atomic.Int32
}

func (d *cutDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil || d.dials.Add(1) > 1 {
		return c, err
	}
	return &cutConn{Conn: c, left: d.cutAfter}, nil
}

type cutConn struct {
	net.Conn
	left int64
}

func (c *cutConn) Read(p []byte) (int, error) {
	if c.left <= 0 {
		c.Conn.Close()
		return 0, errors.New("connection reset (test)")
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	c.left -= int64(n)
	return n, err
}

func TestOpenURLResumesWithRangeAfterACut(t *testing.T) {
	t.Parallel()
	store, _ := openS3(t)
	obj, u, want := storedObject(t, store, storetest.Payload(9, 4<<20))
	d := &cutDialer{cutAfter: 1 << 20}
	c := NewCacheClient(func(wire.ClientMessage) error { return nil })
	c.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableCompression: true}}
	c.PresignedRetryDelay = time.Millisecond
	var resumes atomic.Int32
	c.Presigned = func(op, outcome string) {
		if outcome == "resume" {
			resumes.Add(1)
		}
	}
	size := uint64(obj.FileSize)
	r, err := c.OpenURL(context.Background(), u, &size)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want the %d stored", len(got), err, len(want))
	}
	if resumes.Load() != 1 || d.dials.Load() != 2 {
		t.Fatalf("%d resumes over %d connections, want 1 over 2", resumes.Load(), d.dials.Load())
	}
}

// A connection that stops carrying bytes without closing (half-open) is
// noticed by the idle timeout and resumed on a new one.
func TestOpenURLResumesAfterAStall(t *testing.T) {
	t.Parallel()
	store, srv := openS3(t)
	obj, u, want := storedObject(t, store, storetest.Payload(13, 16<<20))
	proxy := halfopen.New(t, strings.TrimPrefix(srv.Endpoint, "http://"))
	c := NewCacheClient(func(wire.ClientMessage) error { return nil })
	// The URL's host is signed: reach the store through the proxy by dialing it.
	c.HTTPClient = &http.Client{Transport: &http.Transport{DisableCompression: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, proxy.Addr())
		}}}
	c.PresignedIdleTimeout = 300 * time.Millisecond
	c.PresignedRetryDelay = time.Millisecond
	size := uint64(obj.FileSize)
	r, err := c.OpenURL(context.Background(), u, &size)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(r, head); err != nil {
		t.Fatal(err)
	}
	proxy.Freeze()
	rest, err := io.ReadAll(r)
	if got := append(head, rest...); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want the %d stored", len(got), err, len(want))
	}
}

// An expired URL fails at once, so the caller falls back to the session.
func TestOpenURLExpired(t *testing.T) {
	t.Parallel()
	store, _ := openS3(t, func(c *s3store.Config) { c.PresignTTL = time.Second })
	obj, u, _ := storedObject(t, store, storetest.Payload(1, 1000))
	c := NewCacheClient(func(wire.ClientMessage) error { return nil })
	c.PresignedRetryDelay = time.Millisecond
	size := uint64(obj.FileSize)
	var err error
	waitfor.True(t, "the presigned GET to expire", func() bool {
		var r io.ReadCloser
		r, err = c.OpenURL(context.Background(), u, &size)
		if r != nil {
			r.Close()
		}
		return err != nil
	})
	var pe *PresignedError
	if !errors.As(err, &pe) || pe.Status != http.StatusForbidden {
		t.Fatalf("expired URL: %v, want a 403 *PresignedError", err)
	}
}

// The object store down when a transfer starts: each request is tried
// again (the hook brings the store back after the first failure), and
// the transfer completes without a new grant or a fallback.
func TestPresignedRetriesWhileTheStoreIsDown(t *testing.T) {
	t.Parallel()
	store, srv := openS3(t)
	store.MinPartSizeForTests(5 << 20)
	p := newS3Peer(t, store, true)
	var (
		retries atomic.Int32
		back    *sync.Once
	)
	// Every request's first failure waits until the store is back.
	p.c.Presigned = func(op, outcome string) {
		if outcome == "retry" {
			retries.Add(1)
			back.Do(func() { srv.Restart(t) })
		}
	}
	// Down right after the grant (starting the multipart upload needs it).
	back = new(sync.Once)
	p.target = func(n int, g wire.GrantTarget) wire.GrantTarget {
		srv.Stop()
		return g
	}
	nar := make([]byte, 11<<20)
	rand.Read(nar)
	if err := p.c.Upload(context.Background(), "job", randomStorePath("down"), bytes.NewReader(nar), UploadMeta{}); err != nil {
		t.Fatal(err)
	}
	if retries.Load() == 0 || p.requests != 1 || p.cancels != 0 || len(p.committed) != 1 {
		t.Fatalf("%d retries, %d requests, %d cancels, %d committed; want some, 1, 0, 1", retries.Load(), p.requests, p.cancels, len(p.committed))
	}
	if !bytes.Equal(storetest.ReadNAR(t, store, p.committed[0].Key), nar) {
		t.Fatal("the committed object is not the NAR")
	}

	obj := p.committed[0]
	u, err := store.PresignGet(context.Background(), obj.Key)
	if err != nil {
		t.Fatal(err)
	}
	retries.Store(0)
	back = new(sync.Once)
	srv.Stop()
	size := uint64(obj.FileSize)
	r, err := p.c.OpenURL(context.Background(), u, &size)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, readObject(t, store, obj.Key)) || retries.Load() == 0 {
		t.Fatalf("read %d bytes (%v) after %d retries", len(got), err, retries.Load())
	}
}

// A hostile URL (not an object store) that redirects: to a metadata
// address, refused before any dial; round and round, refused after 3.
func TestOpenURLRedirectsAreBoundedAndChecked(t *testing.T) {
	t.Parallel()
	var hops atomic.Int32
	hostile := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metadata" {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
			return
		}
		hops.Add(1)
		http.Redirect(w, r, "/loop?X-Amz-Signature=secret", http.StatusTemporaryRedirect)
	}))
	defer hostile.Close()
	c := NewCacheClient(func(wire.ClientMessage) error { return nil })
	c.PresignedRetryDelay = time.Millisecond
	_, err := c.OpenURL(context.Background(), hostile.URL+"/metadata", nil)
	if !errors.Is(err, dialguard.ErrRefused) {
		t.Fatalf("redirect to the metadata address: %v, want it refused", err)
	}
	_, err = c.OpenURL(context.Background(), hostile.URL+"/loop", nil)
	if !errors.Is(err, errTooManyRedirects) || strings.Contains(err.Error(), "secret") {
		t.Fatalf("redirect loop: %v, want too many redirects without the query", err)
	}
	if n := hops.Load(); n != presignedRedirects+1 {
		t.Fatalf("%d requests, want %d and no retry", n, presignedRedirects+1)
	}
}

func TestContentRange(t *testing.T) {
	for h, want := range map[string][3]int64{
		"bytes 100-199/200": {100, 200, 1},
		"bytes 0-0/*":       {0, -1, 1},
		"bytes */200":       {0, 0, 0},
		"items 1-2/3":       {0, 0, 0},
		"bytes x-1/2":       {0, 0, 0},
	} {
		start, total, ok := contentRange(h)
		if got := [3]int64{start, total, map[bool]int64{true: 1}[ok]}; ok && got != want || !ok && want[2] != 0 {
			t.Errorf("contentRange(%q) = %d, %d, %v; want %v", h, start, total, ok, want)
		}
	}
}

// A worker that cannot reach the object store at all (its network says
// no) against a real server on S3: the presigned grant fails, is
// cancelled, and the server relays the next request; the object lands.
func TestPresignedUnreachableStoreFallsBackToRelay(t *testing.T) {
	t.Parallel()
	store, _ := openS3(t)
	r := newRealServer(t, openSQLite(t), server.Config{NarStore: store})
	client, chunks := dialCacheWorker(t, r)
	client.TempDir = t.TempDir()
	client.PresignedRetryDelay = time.Millisecond
	client.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no route to the store (test)")
	}}}
	var failed atomic.Int32
	client.Presigned = func(op, outcome string) {
		if outcome == "failed" {
			failed.Add(1)
		}
	}
	nar := storetest.Payload(17, 3<<20)
	path := randomStorePath("relayed")
	if err := client.Upload(t.Context(), "", path, bytes.NewReader(nar), UploadMeta{}); err != nil {
		t.Fatal(err)
	}
	if failed.Load() != 1 || chunks.Load() == 0 {
		t.Fatalf("%d presigned failures, %d chunks relayed; want 1 and the object over the session", failed.Load(), chunks.Load())
	}
	got, err := client.Query(t.Context(), "", []string{path}, wire.QueryPull)
	if err != nil || len(got) != 1 || !got[0].Cached || got[0].URL == nil {
		t.Fatalf("pull answer %+v (%v), want the path cached with a presigned url", got, err)
	}
	key := strings.TrimPrefix(*got[0].FileHash, "sha256:")
	if !bytes.Equal(storetest.ReadNAR(t, store, key), nar) {
		t.Fatal("the relayed object is not the NAR")
	}
}
