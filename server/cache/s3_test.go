package cache_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/cache"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// s3Env is a server whose NAR store is a real versitygw bucket, with a
// 6 MiB multipart threshold and 5 MiB parts so tests stay small.
type s3Env struct {
	*cacheProtoEnv
	s3    *s3test.Server
	nars  *s3store.Store
	cache storage.Cache
}

func newS3Env(t *testing.T, db *storage.DB, presign cache.PresignOptions) *s3Env {
	return newS3EnvTTL(t, db, presign, 0)
}

// newS3EnvTTL is newS3Env with presigned URLs valid for ttl (0: 1 h).
func newS3EnvTTL(t *testing.T, db *storage.DB, presign cache.PresignOptions, ttl time.Duration) *s3Env {
	t.Helper()
	srv := s3test.Start(t)
	nars, err := s3store.Open(t.Context(), s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Region: srv.Region,
		PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: t.TempDir(), PresignTTL: ttl}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	nars.MinPartSizeForTests(5 << 20)
	if presign.MultipartThreshold == 0 {
		presign.MultipartThreshold = 6 << 20
	}
	e := newCacheProtoEnv(t, db, server.Config{NarStore: nars, NarPresign: presign})
	if err := db.SetCachePublic(t.Context(), e.Env.Cache.ID, true); err != nil {
		t.Fatal(err)
	}
	return &s3Env{cacheProtoEnv: e, s3: srv, nars: nars, cache: e.Env.Cache}
}

// httpPut sends body to a presigned URL as a worker does.
func httpPut(t *testing.T, url string, body []byte) (etag string, status int) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-nix-nar")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("PUT: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Header.Get("ETag"), resp.StatusCode
}

// presignedUpload asks to upload c as path and sends body (normally c.zst)
// to the granted URLs, then reports UploadFinished with c's metadata.
func presignedUpload(t *testing.T, sess *session.WorkerSession, id uint64, path string, c compressed, body []byte) (wire.GrantTarget, wire.UploadOutcome) {
	t.Helper()
	send(t, sess, &wire.UploadRequest{JobID: "job", RequestID: id, Object: &wire.UploadNar{StorePath: path}, Size: c.meta.NarSize})
	grant, outcome := awaitGrant(t, sess, id)
	if outcome != nil {
		return nil, outcome
	}
	meta := c.meta
	switch g := grant.(type) {
	case *wire.GrantPut:
		if _, code := httpPut(t, g.URL, body); code != http.StatusOK {
			t.Fatalf("presigned PUT answered %d", code)
		}
	case *wire.PresignedMultipart:
		mp := &wire.CompletedMultipart{UploadID: g.UploadID}
		for i, part := range slices.Collect(slices.Chunk(body, int(g.PartSize))) {
			etag, code := httpPut(t, g.PartURLs[i], part)
			if code != http.StatusOK {
				t.Fatalf("part %d answered %d", i, code)
			}
			mp.ETags = append(mp.ETags, etag)
		}
		meta.Multipart = mp
	default:
		t.Fatalf("granted %T, want a presigned target", grant)
	}
	send(t, sess, &wire.UploadFinished{RequestID: id, Metadata: &meta})
	return grant, recvAs[*wire.UploadCommitted](t, sess).Outcome
}

func httpGet(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// stagingLeft lists what the bucket holds outside the objects' keys.
func (e *s3Env) stagingLeft(t *testing.T) []string {
	var left []string
	for _, k := range e.s3.Keys(t) {
		if !strings.HasPrefix(k, "nars/") {
			left = append(left, k)
		}
	}
	return left
}

func TestS3PresignedUploadsAndDownloads(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newS3Env(t, db, cache.PresignOptions{})
		small, large := testStorePath("small"), testStorePath("large")
		cs := compressNar(t, randomNar(2<<20))
		cl := compressNar(t, randomNar(11<<20)) // over the 6 MiB threshold: three 5 MiB parts
		e.produce(small, large)
		w := e.projectWorker()

		grant, out := presignedUpload(t, w.Sess, 1, small, cs, cs.zst)
		if _, put := grant.(*wire.GrantPut); !put || !isOk(out) {
			t.Fatalf("small: grant %T, outcome %+v", grant, out)
		}
		grant, out = presignedUpload(t, w.Sess, 2, large, cl, cl.zst)
		if mp, ok := grant.(*wire.PresignedMultipart); !ok || mp.PartSize != 5<<20 || !isOk(out) {
			t.Fatalf("large: grant %+v, outcome %+v", grant, out)
		}
		if left := e.stagingLeft(t); len(left) != 0 {
			t.Fatalf("staging left: %q", left)
		}
		// Stored once: a second request is skipped.
		if grant, _ := uploadNar(t, w.Sess, 3, small, cs); grant == nil {
			t.Fatal("no grant")
		} else if _, skip := grant.(*wire.GrantSkip); !skip {
			t.Fatalf("second upload granted %T", grant)
		}

		// Pull answers carry presigned URLs that fetch the objects.
		send(t, w.Sess, &wire.CacheQuery{QueryID: "p", Paths: []string{small, large}, Mode: wire.QueryPull})
		st := recvAs[*wire.CacheStatus](t, w.Sess)
		for i, want := range [][]byte{cs.zst, cl.zst} {
			got := st.Cached[i]
			if !got.Cached || got.URL == nil {
				t.Fatalf("pull entry %d: %+v", i, got)
			}
			resp, body := httpGet(t, *got.URL)
			if resp.StatusCode != 200 || !bytes.Equal(body, want) {
				t.Fatalf("pull URL %d: %d, %d bytes", i, resp.StatusCode, len(body))
			}
		}

		// The HTTP cache redirects to the store, and the client gets the bytes.
		key := strings.TrimPrefix(cs.meta.FileHash, "sha256:")
		resp, body := httpGet(t, e.httpURL()+"/cache/main/nar/"+key+".nar.zst")
		if resp.StatusCode != 200 || !bytes.Equal(body, cs.zst) || !strings.HasPrefix(resp.Request.URL.String(), e.s3.Endpoint) {
			t.Fatalf("NAR over HTTP: %d, %d bytes, from %s", resp.StatusCode, len(body), resp.Request.URL)
		}
		hash, _ := storage.StorePathHash(small)
		if resp, body := httpGet(t, e.httpURL()+"/cache/main/"+hash+".narinfo"); resp.StatusCode != 200 ||
			!strings.Contains(string(body), "FileHash: "+cs.meta.FileHash) {
			t.Fatalf("narinfo: %d %s", resp.StatusCode, body)
		}
	})
}

// By default every Pull answer for an S3 object carries a presigned GET,
// the smallest (a .drv's few hundred bytes) too, so no NAR byte of a
// worker's pull crosses the server or a federation proxy; a configured
// minimum keeps objects up to it on the session (issue 31).
func TestS3PullURLsForSmallObjects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		min     int64
		tinyURL bool
	}{{"default", 0, true}, {"min 64 KiB", 64 << 10, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, err := storage.Open(t.Context(), storagetest.SQLiteURL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			e := newS3Env(t, db, cache.PresignOptions{PullURLMinBytes: tc.min})
			tiny, big := testStorePath("tiny.drv"), testStorePath("big")
			ct, cb := compressNar(t, randomNar(600)), compressNar(t, randomNar(1<<20))
			e.produce(tiny, big)
			w := e.projectWorker()
			for i, u := range []struct {
				path string
				c    compressed
			}{{tiny, ct}, {big, cb}} {
				if _, out := presignedUpload(t, w.Sess, uint64(i+1), u.path, u.c, u.c.zst); !isOk(out) {
					t.Fatalf("upload %s: %+v", u.path, out)
				}
			}
			send(t, w.Sess, &wire.CacheQuery{QueryID: "p", Paths: []string{tiny, big}, Mode: wire.QueryPull})
			st := recvAs[*wire.CacheStatus](t, w.Sess)
			if len(st.Cached) != 2 || !st.Cached[0].Cached || !st.Cached[1].Cached {
				t.Fatalf("pull answer: %+v", st.Cached)
			}
			if got := st.Cached[0].URL != nil; got != tc.tinyURL {
				t.Fatalf("the %d-byte object has a URL: %v, want %v", len(ct.zst), got, tc.tinyURL)
			}
			if st.Cached[1].URL == nil {
				t.Fatalf("the %d-byte object has no URL", len(cb.zst))
			}
			if tc.tinyURL {
				if resp, body := httpGet(t, *st.Cached[0].URL); resp.StatusCode != 200 || !bytes.Equal(body, ct.zst) {
					t.Fatalf("tiny's URL: %d, %d bytes", resp.StatusCode, len(body))
				}
			}
		})
	}
}

// Streaming through stays available: with StreamNars the HTTP cache sends
// the bytes itself (ranges included) instead of redirecting.
func TestS3StreamThrough(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newS3Env(t, db, cache.PresignOptions{StreamNars: true, StreamUploads: true})
		path := testStorePath("out")
		c := compressNar(t, randomNar(1<<20))
		e.produce(path)
		w := e.projectWorker()
		grant, out := uploadNar(t, w.Sess, 1, path, c)
		if _, pass := grant.(*wire.GrantPassthrough); !pass || !isOk(out) {
			t.Fatalf("grant %T, outcome %+v", grant, out)
		}
		key := strings.TrimPrefix(c.meta.FileHash, "sha256:")
		req, _ := http.NewRequest(http.MethodGet, e.httpURL()+"/cache/main/nar/"+key+".nar.zst", nil)
		req.Header.Set("Range", "bytes=100-")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, c.zst[100:]) || resp.Request.URL.Host != req.URL.Host {
			t.Fatalf("ranged NAR: %d, %d bytes from %s", resp.StatusCode, len(body), resp.Request.URL)
		}
	})
}

// A worker that uploads other bytes than it declared, or nothing, or whose
// store goes down before the finish: nothing is committed or served, and
// nothing stays in the bucket.
func TestS3PresignedUploadFailures(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newS3Env(t, db, cache.PresignOptions{})
		w := e.projectWorker()
		declared := compressNar(t, randomNar(300<<10))
		other := compressNar(t, randomNar(300<<10))
		notRecorded := func(path string) {
			t.Helper()
			hash, _ := storage.StorePathHash(path)
			if _, err := db.CachePath(t.Context(), e.cache.ID, hash); err == nil {
				t.Fatal("the path was recorded")
			}
			if resp, _ := httpGet(t, e.httpURL()+"/cache/main/"+hash+".narinfo"); resp.StatusCode != 404 {
				t.Fatalf("narinfo answered %d", resp.StatusCode)
			}
		}
		bucketEmpty := func() {
			t.Helper()
			waitfor.True(t, "the bucket to be empty", func() bool { return len(e.s3.Keys(t)) == 0 })
		}

		path := testStorePath("liar")
		e.produce(path)
		_, out := presignedUpload(t, w.Sess, 1, path, declared, other.zst)
		if _, rejected := out.(*wire.UploadRejected); !rejected {
			t.Fatalf("other bytes: %+v, want Rejected", out)
		}
		notRecorded(path)
		bucketEmpty()

		// UploadFinished without an upload.
		path = testStorePath("nothing")
		e.produce(path)
		send(t, w.Sess, &wire.UploadRequest{JobID: "job", RequestID: 2, Object: &wire.UploadNar{StorePath: path}, Size: declared.meta.NarSize})
		if g, _ := awaitGrant(t, w.Sess, 2); g == nil {
			t.Fatal("no grant")
		}
		meta := declared.meta
		send(t, w.Sess, &wire.UploadFinished{RequestID: 2, Metadata: &meta})
		if out := recvAs[*wire.UploadCommitted](t, w.Sess).Outcome; func() bool { _, ok := out.(*wire.UploadRejected); return !ok }() {
			t.Fatalf("nothing uploaded: %+v, want Rejected", out)
		}
		notRecorded(path)

		// Chunks on a presigned grant are refused.
		path = testStorePath("chunks")
		e.produce(path)
		send(t, w.Sess, &wire.UploadRequest{JobID: "job", RequestID: 3, Object: &wire.UploadNar{StorePath: path}, Size: declared.meta.NarSize})
		awaitGrant(t, w.Sess, 3)
		send(t, w.Sess, &wire.UploadChunk{RequestID: 3, Data: declared.zst[:100]})
		if out := recvAs[*wire.UploadCommitted](t, w.Sess).Outcome; func() bool { _, ok := out.(*wire.UploadRejected); return !ok }() {
			t.Fatalf("chunks on a presigned grant: %+v", out)
		}
		bucketEmpty()

		// The store goes down between the PUT and the finish: Retry, not
		// a commit; what it left is swept once it is back.
		path = testStorePath("down")
		e.produce(path)
		send(t, w.Sess, &wire.UploadRequest{JobID: "job", RequestID: 4, Object: &wire.UploadNar{StorePath: path}, Size: declared.meta.NarSize})
		g, _ := awaitGrant(t, w.Sess, 4)
		httpPut(t, g.(*wire.GrantPut).URL, declared.zst)
		e.s3.Stop()
		meta = declared.meta
		send(t, w.Sess, &wire.UploadFinished{RequestID: 4, Metadata: &meta})
		if out := recvAs[*wire.UploadCommitted](t, w.Sess).Outcome; func() bool { _, ok := out.(*wire.UploadRetry); return !ok }() {
			t.Fatalf("store down: %+v, want Retry", out)
		}
		e.s3.Restart(t)
		notRecorded(path)
		if keys, _ := e.nars.Keys(t.Context()); len(keys) != 0 {
			t.Fatalf("objects after a failed commit: %q", keys)
		}
		if _, err := e.nars.Sweep(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		bucketEmpty()

		// A worker that leaves between grant and finish (or a server that
		// restarts: the sweep covers that): its staging is dropped.
		path = testStorePath("gone")
		e.produce(path)
		w2 := e.projectWorker()
		send(t, w2.Sess, &wire.UploadRequest{JobID: "job", RequestID: 5, Object: &wire.UploadNar{StorePath: path}, Size: declared.meta.NarSize})
		g, _ = awaitGrant(t, w2.Sess, 5)
		httpPut(t, g.(*wire.GrantPut).URL, declared.zst)
		w2.Sess.Close(session.CloseNormal, "worker leaves")
		bucketEmpty()
		notRecorded(path)
	})
}

// Nix follows the HTTP cache's redirect to the S3 store and checks the
// signatures: a real `nix copy` of a closure pushed into an S3-backed cache.
func TestNixCopiesFromS3ThroughRedirect(t *testing.T) {
	srv := s3test.Start(t)
	nars, err := s3store.Open(t.Context(), s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Region: srv.Region,
		PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StagingDir: t.TempDir()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := newCacheEnv(t, server.Config{NarStore: nars})
	src := newNixStore(t)
	hello, greet := buildAndPush(t, e, src, "main")
	cacheURL := e.url + "/cache/main"
	dst := newNixStore(t, "require-sigs = true", "trusted-public-keys = "+e.cache.PublicKey())
	dst.must("nix", "copy", "--from", cacheURL, "--to", dst.root, greet.Path)
	if got := dst.contents(hello.Path); got != "hello\n" {
		t.Fatalf("copied hello holds %q", got)
	}
	// The bytes came from the store, not through the server.
	hash, _ := storage.StorePathHash(hello.Path)
	_, narinfo := httpGet(t, cacheURL+"/"+hash+".narinfo")
	var narURL string
	for line := range strings.Lines(string(narinfo)) {
		if u, ok := strings.CutPrefix(strings.TrimSpace(line), "URL: "); ok {
			narURL = u
		}
	}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(cacheURL + "/" + narURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc, srv.Endpoint) {
		t.Fatalf("NAR request answered %d, Location %q", resp.StatusCode, loc)
	}
	if keys, _ := nars.Keys(t.Context()); len(keys) != 2 {
		t.Fatalf("the store holds %d objects, want hello's and greet's", len(keys))
	}
	// The store's URLs name 127.0.0.1: `gradient server status` says so.
	req, _ := http.NewRequest(http.MethodGet, e.url+"/api/v1/server", nil)
	req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	status, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(status), "loopback or link-local") {
		t.Fatalf("server status lacks the loopback warning: %s", status)
	}
}

// A grant whose URLs expire before UploadFinished is answered Retry and
// frees the path: the next request is relayed and commits.
func TestS3ExpiredGrantRetried(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newS3EnvTTL(t, db, cache.PresignOptions{}, 2*time.Second)
		path := testStorePath("slow")
		c := compressNar(t, randomNar(100<<10))
		e.produce(path)
		w := e.projectWorker()
		send(t, w.Sess, &wire.UploadRequest{JobID: "job", RequestID: 1, Object: &wire.UploadNar{StorePath: path}, Size: c.meta.NarSize})
		g, _ := awaitGrant(t, w.Sess, 1)
		if _, put := g.(*wire.GrantPut); !put {
			t.Fatalf("granted %T", g)
		}
		if out := recvAs[*wire.UploadCommitted](t, w.Sess).Outcome; func() bool { _, ok := out.(*wire.UploadRetry); return !ok }() {
			t.Fatalf("expired grant: %+v, want Retry", out)
		}
		// The worker could not finish in time: its retry is relayed.
		if grant, out := uploadNar(t, w.Sess, 2, path, c); !isOk(out) {
			t.Fatalf("retry after expiry: %T %+v", grant, out)
		} else if _, pass := grant.(*wire.GrantPassthrough); !pass {
			t.Fatalf("retry after expiry granted %T, want Passthrough", grant)
		}
	})
}

// A worker that cannot use its presigned URLs cancels; its next request for
// the path is relayed through the server (Passthrough) and commits.
func TestS3CancelledGrantFallsBackToPassthrough(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newS3Env(t, db, cache.PresignOptions{})
		path := testStorePath("unreachable")
		c := compressNar(t, randomNar(300<<10))
		e.produce(path)
		w := e.projectWorker()
		send(t, w.Sess, &wire.UploadRequest{JobID: "job", RequestID: 1, Object: &wire.UploadNar{StorePath: path}, Size: c.meta.NarSize})
		if g, _ := awaitGrant(t, w.Sess, 1); func() bool { _, ok := g.(*wire.GrantPut); return !ok }() {
			t.Fatalf("first grant %T, want Put", g)
		}
		send(t, w.Sess, &wire.UploadCancel{RequestID: 1})
		grant, out := uploadNar(t, w.Sess, 2, path, c)
		if _, pass := grant.(*wire.GrantPassthrough); !pass || !isOk(out) {
			t.Fatalf("after a cancelled presigned grant: %T, %+v; want Passthrough and Ok", grant, out)
		}
		waitfor.True(t, "only the object in the bucket", func() bool { return len(e.stagingLeft(t)) == 0 })
		// Another path still gets a presigned grant.
		other := testStorePath("other")
		e.produce(other)
		oc := compressNar(t, randomNar(1000))
		if grant, out := presignedUpload(t, w.Sess, 3, other, oc, oc.zst); !isOk(out) {
			t.Fatalf("other path: %T %+v", grant, out)
		}
	})
}
