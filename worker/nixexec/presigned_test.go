package nixexec

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

// Pulls whose Pull answers carry presigned URLs (docs/protocol/cache.md §4.6):
// the objects sit in a real versitygw, the GETs are the real cache
// client's, the session side is the fake cache.

// urlCache answers Pull queries with a presigned GET for each path it
// has a URL for.
type urlCache struct {
	*fakeCache
	client *worker.CacheClient
	urls   map[string]string
}

func (c *urlCache) Query(ctx context.Context, jobID string, paths []string, mode wire.QueryMode) ([]wire.CachedPath, error) {
	out, err := c.fakeCache.Query(ctx, jobID, paths, mode)
	if mode == wire.QueryPull {
		for i := range out {
			if u, ok := c.urls[out[i].Path]; ok && out[i].Cached {
				out[i].URL = &u
			}
		}
	}
	return out, err
}

func (c *urlCache) OpenURL(ctx context.Context, rawURL string, size *uint64) (io.ReadCloser, error) {
	c.rec.add(event{kind: "get"})
	return c.client.OpenURL(ctx, rawURL, size)
}

type s3Fixture struct {
	srv   *s3test.Server
	store *s3store.Store
	cache *urlCache
}

// withS3 gives h's job a cache whose Pull answers carry presigned URLs.
func withS3(t *testing.T, h *harness, ttl time.Duration) *s3Fixture {
	srv := s3test.Start(t)
	store, err := s3store.Open(context.Background(), s3store.Config{Endpoint: srv.Endpoint, Bucket: srv.Bucket, Region: srv.Region,
		PathStyle: true, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PresignTTL: ttl, StagingDir: t.TempDir()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := worker.NewCacheClient(func(wire.ClientMessage) error { return nil })
	client.PresignedRetryDelay = time.Millisecond
	c := &urlCache{fakeCache: h.cache, client: client, urls: map[string]string{}}
	h.rep.cache = c
	return &s3Fixture{srv: srv, store: store, cache: c}
}

// publish stores body in the bucket as the object of p's cache entry
// (keyed by the entry's file hash, whatever body is) and presigns it.
func (f *s3Fixture) publish(t *testing.T, p string, body []byte) {
	t.Helper()
	key := narstore.KeyOf(sha256.Sum256(fileOf(p)))
	if _, err := f.srv.Client().PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(f.srv.Bucket),
		Key: aws.String("nars/" + key + ".nar.zst"), Body: bytes.NewReader(body)}); err != nil {
		t.Fatal(err)
	}
	u, err := f.store.PresignGet(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	f.cache.urls[p] = u
}

func pulledOverSession(h *harness) []string {
	var out []string
	for _, e := range h.rec.of("pull") {
		out = append(out, e.paths...)
	}
	slices.Sort(out)
	return out
}

// Every path with a URL comes from the object store, none over the session.
func TestUnitBuildPullsOverPresignedURLs(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	f := withS3(t, h, 0)
	pulled := []string{g.target, g.dep, g.src1, g.src2, g.depOut}
	for _, p := range pulled {
		f.publish(t, p, fileOf(p))
	}
	if err := h.run(context.Background(), buildJob(spec("b1", g.target))); err != nil {
		t.Fatal(err)
	}
	if got := pulledOverSession(h); len(got) != 0 {
		t.Fatalf("pulled over the session: %v", got)
	}
	if n := len(h.rec.of("get")); n != len(pulled) {
		t.Fatalf("%d presigned GETs, want %d", n, len(pulled))
	}
	for _, p := range pulled {
		if !bytes.Equal(h.store.importedFiles[p], fileOf(p)) {
			t.Errorf("%s imported %q", p, h.store.importedFiles[p])
		}
	}
}

// An object whose bytes differ from the cache's hash is refused and the
// path pulled over the session; when the session's bytes are wrong too,
// the job fails as InputsUnavailable naming it, nothing imported.
func TestUnitBuildPresignedCorruptObjectFallsBack(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	f := withS3(t, h, 0)
	f.publish(t, g.dep, []byte("zst of something else, same length?"))
	f.publish(t, g.src1, fileOf(g.src1))
	if err := h.run(context.Background(), buildJob(spec("b1", g.target))); err != nil {
		t.Fatal(err)
	}
	if got := pulledOverSession(h); !slices.Contains(got, g.dep) || slices.Contains(got, g.src1) {
		t.Fatalf("pulled over the session: %v, want %s (its object is corrupt) and not %s", got, g.dep, g.src1)
	}
	if !bytes.Equal(h.store.importedFiles[g.dep], fileOf(g.dep)) {
		t.Fatalf("imported %q for %s", h.store.importedFiles[g.dep], g.dep)
	}

	h2 := newHarness(t)
	g2 := h2.setupBuild()
	f2 := withS3(t, h2, 0)
	f2.publish(t, g2.dep, []byte("corrupted bytes"))
	h2.cache.content[g2.dep] = []byte("corrupted bytes")
	err := h2.run(context.Background(), buildJob(spec("b1", g2.target)))
	je := jobError(t, err, wire.FailureInputsUnavailable)
	if !reflect.DeepEqual(je.MissingPaths, []string{g2.dep}) {
		t.Fatalf("missing paths %v, want [%s]", je.MissingPaths, g2.dep)
	}
	if _, ok := h2.store.importedFiles[g2.dep]; ok {
		t.Fatal("a corrupt object was imported")
	}
}

// An expired URL (403) falls back to the session at once.
func TestUnitBuildPresignedExpiredURLFallsBack(t *testing.T) {
	h := newHarness(t)
	g := h.setupBuild()
	f := withS3(t, h, time.Second)
	f.publish(t, g.target, fileOf(g.target))
	waitfor.True(t, "the presigned URL to expire", func() bool {
		r, err := f.cache.client.OpenURL(context.Background(), f.cache.urls[g.target], nil)
		if r != nil {
			r.Close()
		}
		return err != nil
	})
	if err := h.run(context.Background(), buildJob(spec("b1", g.target))); err != nil {
		t.Fatal(err)
	}
	if got := pulledOverSession(h); !slices.Contains(got, g.target) {
		t.Fatalf("pulled over the session: %v, want %s", got, g.target)
	}
	if !bytes.Equal(h.store.importedFiles[g.target], fileOf(g.target)) {
		t.Fatalf("imported %q", h.store.importedFiles[g.target])
	}
}
