package cache_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/cache"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

func TestCacheQueryModes(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		dep := testStorePath("dep")
		e.putPath(t, e.Cache.ID, dep, randomNar(1000))
		have := e.putPath(t, e.Cache.ID, testStorePath("have"), randomNar(5000), dep)
		missing := testStorePath("missing")
		w := e.projectWorker()
		paths := []string{have.StorePath, missing, "/nix/store/short-hash"}

		send(t, w.Sess, &wire.CacheQuery{QueryID: "n", Paths: paths, Mode: wire.QueryNormal})
		st := recvAs[*wire.CacheStatus](t, w.Sess)
		if st.QueryID != "n" || len(st.Cached) != 1 || st.Cached[0].Path != have.StorePath || !st.Cached[0].Cached ||
			*st.Cached[0].FileSize != uint64(have.FileSize) || *st.Cached[0].NarSize != uint64(have.NarSize) ||
			st.Cached[0].NarHash != nil || st.Cached[0].References != nil {
			t.Fatalf("Normal: %+v", st)
		}

		send(t, w.Sess, &wire.CacheQuery{QueryID: "p", Paths: paths, Mode: wire.QueryPull})
		st = recvAs[*wire.CacheStatus](t, w.Sess)
		if st.QueryID != "p" || len(st.Cached) != 3 || st.Cached[1].Cached || st.Cached[2].Cached {
			t.Fatalf("Pull: %+v", st)
		}
		got := st.Cached[0]
		if !got.Cached || *got.NarHash != have.NarHash || *got.FileHash != have.FileHash || *got.FileSize != uint64(have.FileSize) ||
			!slices.Equal(*got.References, []string{dep}) || got.URL != nil || len(*got.Signatures) != 1 {
			t.Fatalf("Pull entry: %+v", got)
		}
		// The signature is the cache key's over the narinfo fingerprint.
		name, sig, _ := strings.Cut((*got.Signatures)[0], ":")
		raw, _ := base64.StdEncoding.DecodeString(sig)
		key, err := db.CacheSigningKey(t.Context(), e.Cache.ID)
		if err != nil || name != key.Name || !ed25519.Verify(key.Private.Public().(ed25519.PublicKey), cache.Fingerprint(have), raw) {
			t.Fatalf("signature %q does not verify (%v)", (*got.Signatures)[0], err)
		}

		e.produce(paths[:2]...)
		send(t, w.Sess, &wire.CacheQuery{JobID: "job", QueryID: "u", Paths: paths[:2], Mode: wire.QueryPush})
		st = recvAs[*wire.CacheStatus](t, w.Sess)
		if len(st.Cached) != 2 || !st.Cached[0].Cached || st.Cached[1].Cached || st.Cached[0].FileSize != nil {
			t.Fatalf("Push: %+v", st)
		}

		many := make([]string, 1000+1) // one more than a query may name
		for i := range many {
			many[i] = missing
		}
		send(t, w.Sess, &wire.CacheQuery{QueryID: "big", Paths: many, Mode: wire.QueryNormal})
		if ce := recvAs[*wire.CacheError](t, w.Sess); ce.QueryID != "big" || !strings.Contains(ce.Message, "at most 1000 paths") {
			t.Fatalf("oversized query: %+v", ce)
		}

		// Known derivations are those some evaluation built; a .drv that
		// is merely cached is not (its outputs may not exist yet).
		drv := testStorePath("x.drv")
		e.putPath(t, e.Cache.ID, drv, randomNar(100))
		send(t, w.Sess, &wire.QueryKnownDerivations{QueryID: "k0", DrvPaths: []string{drv}})
		if kd := recvAs[*wire.KnownDerivations](t, w.Sess); kd.QueryID != "k0" || len(kd.Known) != 0 {
			t.Fatalf("known derivations before a build: %+v", kd)
		}
		out := buildDerivation(t, e.DB, e.Project.ID, drv)
		send(t, w.Sess, &wire.QueryKnownDerivations{QueryID: "k1", DrvPaths: []string{drv}})
		if kd := recvAs[*wire.KnownDerivations](t, w.Sess); kd.QueryID != "k1" || len(kd.Known) != 0 {
			t.Fatalf("known derivations with the output not cached: %+v", kd)
		}
		e.putPath(t, e.Cache.ID, out, randomNar(100))
		send(t, w.Sess, &wire.QueryKnownDerivations{QueryID: "k", DrvPaths: []string{drv, testStorePath("y.drv")}})
		if kd := recvAs[*wire.KnownDerivations](t, w.Sess); kd.QueryID != "k" || !slices.Equal(kd.Known, []string{drv}) {
			t.Fatalf("known derivations: %+v", kd)
		}
		send(t, w.Sess, &wire.EvalCachePull{JobID: "j", Fingerprint: "f"})
		if r := recvAs[*wire.EvalCachePullResult](t, w.Sess); r.JobID != "j" {
			t.Fatalf("eval cache: %+v", r)
		} else if _, miss := r.Outcome.(*wire.EvalCacheMiss); !miss {
			t.Fatalf("eval cache: %+v", r.Outcome)
		}
	})
}

// A worker reads and writes only the caches it is authorized for: its
// projects' caches and the caches it is a cache peer of.
func TestCacheAccessRule(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		other, err := db.CreateCache(t.Context(), storage.NewCache{Name: "other"})
		if err != nil {
			t.Fatal(err)
		}
		secret := e.putPath(t, other.ID, testStorePath("secret"), randomNar(2000))
		mine := e.putPath(t, e.Cache.ID, testStorePath("mine"), randomNar(2000))

		w := e.projectWorker()
		send(t, w.Sess, &wire.CacheQuery{QueryID: "q", Paths: []string{secret.StorePath, mine.StorePath}, Mode: wire.QueryPull})
		st := recvAs[*wire.CacheStatus](t, w.Sess)
		if len(st.Cached) != 2 || st.Cached[0].Cached || !st.Cached[1].Cached {
			t.Fatalf("project worker sees %+v", st)
		}
		send(t, w.Sess, &wire.NarRequest{JobID: "j", Paths: []string{secret.StorePath}})
		if u := recvAs[*wire.NarUnavailable](t, w.Sess); u.StorePath != secret.StorePath {
			t.Fatalf("%+v", u)
		}

		// A cache peer of "other" reads it, not "main", and its uploads
		// land in "other" only.
		peer := e.cachePeerWorker(other)
		send(t, peer.Sess, &wire.CacheQuery{QueryID: "q", Paths: []string{secret.StorePath, mine.StorePath}, Mode: wire.QueryNormal})
		st = recvAs[*wire.CacheStatus](t, peer.Sess)
		if len(st.Cached) != 1 || st.Cached[0].Path != secret.StorePath {
			t.Fatalf("cache peer sees %+v", st)
		}
		path := testStorePath("out")
		if _, out := uploadNar(t, peer.Sess, 1, path, compressNar(t, randomNar(3000))); !isOk(out) {
			t.Fatalf("upload: %+v", out)
		}
		hash, _ := storage.StorePathHash(path)
		if _, err := db.CachePath(t.Context(), other.ID, hash); err != nil {
			t.Fatalf("not in the peer's cache: %v", err)
		}
		if _, err := db.CachePath(t.Context(), e.Cache.ID, hash); err == nil {
			t.Fatal("the upload reached a cache the peer may not write")
		}
	})
}

func isOk(o wire.UploadOutcome) bool { _, ok := o.(*wire.UploadOk); return ok }

func TestNarPullAndResume(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		big := e.putPath(t, e.Cache.ID, testStorePath("big"), randomNar(3<<20)) // incompressible: 3 MiB object
		small := e.putPath(t, e.Cache.ID, testStorePath("small"), randomNar(100))
		want := func(p storage.CachePath) []byte {
			obj, _, err := e.store.Open(t.Context(), p.ObjectKey)
			if err != nil {
				t.Fatal(err)
			}
			defer obj.Close()
			b, _ := io.ReadAll(obj)
			return b
		}
		w := e.projectWorker()
		send(t, w.Sess, &wire.NarRequest{JobID: "j", Paths: []string{small.StorePath}})
		got, h := pullStream(t, w.Sess, nil)
		if h.TotalBytes != uint64(small.FileSize) || !bytes.Equal(got, want(small)) {
			t.Fatalf("small: %d bytes, header %+v", len(got), h)
		}

		// Take the first chunk of the big one, then drop the connection.
		send(t, w.Sess, &wire.NarRequest{JobID: "j", Paths: []string{big.StorePath}})
		h = recvAs[*wire.NarStreamHeader](t, w.Sess)
		first := recvAs[*wire.NarPush](t, w.Sess)
		if first.Offset != 0 || first.IsFinal || len(first.Data) != 512<<10 {
			t.Fatalf("first chunk: offset %d, %d bytes, final %v", first.Offset, len(first.Data), first.IsFinal)
		}
		prefix := bytes.Clone(first.Data)
		w.Sess.Close(1000, "drop")

		w2 := e.projectWorker()
		send(t, w2.Sess, &wire.NarRequestResume{JobID: "j", StorePath: big.StorePath, ReceivedBytes: uint64(len(prefix)), StreamToken: h.StreamToken})
		h2 := recvAs[*wire.NarStreamHeader](t, w2.Sess)
		next := recvAs[*wire.NarPush](t, w2.Sess)
		if h2.StreamToken != h.StreamToken || next.Offset != uint64(len(prefix)) {
			t.Fatalf("resume restarted at %d (token %q, was %q)", next.Offset, h2.StreamToken, h.StreamToken)
		}
		got = append(prefix, next.Data...)
		for !next.IsFinal {
			next = recvAs[*wire.NarPush](t, w2.Sess)
			got = append(got[:next.Offset], next.Data...)
		}
		if !bytes.Equal(got, want(big)) {
			t.Fatal("resumed download differs from the object")
		}

		// A stale token restarts from 0.
		send(t, w2.Sess, &wire.NarRequestResume{JobID: "j", StorePath: big.StorePath, ReceivedBytes: 1000, StreamToken: "stale"})
		recvAs[*wire.NarStreamHeader](t, w2.Sess)
		if p := recvAs[*wire.NarPush](t, w2.Sess); p.Offset != 0 {
			t.Fatalf("stale token resumed at %d", p.Offset)
		}
	})
}

// A resume of a path whose stream is still in flight (a proxy pacing a
// slow worker resumes before the old stream ended) stops the old
// stream: the object is sent once more from the offset, not twice.
func TestResumeStopsTheStreamInFlight(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		const size = 48 << 20 // far more than the lanes and sockets hold
		big := e.putPath(t, e.Cache.ID, testStorePath("big"), randomNar(size))
		small := e.putPath(t, e.Cache.ID, testStorePath("small"), randomNar(100))
		w := e.projectWorker()
		send(t, w.Sess, &wire.NarRequest{JobID: "j", Paths: []string{big.StorePath}})
		h := recvAs[*wire.NarStreamHeader](t, w.Sess)
		first := recvAs[*wire.NarPush](t, w.Sess)
		got := bytes.Clone(first.Data)
		// The old stream is blocked on the unread socket meanwhile.
		send(t, w.Sess, &wire.NarRequestResume{JobID: "j", StorePath: big.StorePath, ReceivedBytes: uint64(len(got)), StreamToken: h.StreamToken})
		headers, finals, chunks := 0, 0, 0
		for finals == 0 {
			switch m := recvAs[wire.ServerMessage](t, w.Sess).(type) {
			case *wire.NarStreamHeader:
				headers++
			case *wire.NarPush:
				chunks++
				got = append(got[:m.Offset], m.Data...)
				if m.IsFinal {
					finals++
				}
			}
		}
		// Whatever the old stream still sends comes before the next
		// path's stream ends.
		send(t, w.Sess, &wire.NarRequest{JobID: "j", Paths: []string{small.StorePath}})
		for done := false; !done; {
			switch m := recvAs[wire.ServerMessage](t, w.Sess).(type) {
			case *wire.NarPush:
				if m.StorePath == small.StorePath {
					done = m.IsFinal
					continue
				}
				chunks++
				if m.IsFinal {
					finals++
				}
			}
		}
		if headers != 1 || finals != 1 {
			t.Fatalf("after the resume: %d headers, %d final chunks of the object, want 1 each", headers, finals)
		}
		if uint64(len(got)) != uint64(big.FileSize) {
			t.Fatalf("got %d bytes of %d", len(got), big.FileSize)
		}
		// The resumed stream is the object less one chunk; the old one
		// sent at most what was queued when it was stopped.
		if resumed := int(big.FileSize)/(512<<10) - 1; chunks > 2*resumed-16 {
			t.Fatalf("%d chunks after the resume; the resumed stream alone has %d", chunks, resumed+1)
		}
	})
}

func TestUploadThenServedOverHTTP(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		if err := db.SetCachePublic(t.Context(), e.Cache.ID, true); err != nil {
			t.Fatal(err)
		}
		dep := testStorePath("dep")
		path := testStorePath("out")
		nar := randomNar(1<<20 + 12345)
		c := compressNar(t, nar, dep) // a full-path reference
		e.produce(path)
		w := e.projectWorker()
		grant, out := uploadNar(t, w.Sess, 7, path, c)
		if _, pass := grant.(*wire.GrantPassthrough); !pass || !isOk(out) {
			t.Fatalf("grant %+v, outcome %+v", grant, out)
		}
		// Once stored, a second request is skipped.
		if grant, out := uploadNar(t, w.Sess, 8, path, c); !isOk(out) {
			t.Fatalf("second upload: %+v %+v", grant, out)
		} else if _, skip := grant.(*wire.GrantSkip); !skip {
			t.Fatalf("second upload granted %+v, want Skip", grant)
		}

		hash, _ := storage.StorePathHash(path)
		resp, err := http.Get(e.httpURL() + "/cache/main/" + hash + ".narinfo")
		if err != nil {
			t.Fatal(err)
		}
		narinfo, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range []string{"StorePath: " + path, "FileHash: " + c.meta.FileHash, "NarHash: " + c.meta.NarHash,
			"References: " + strings.TrimPrefix(dep, "/nix/store/")} {
			if !strings.Contains(string(narinfo), line) {
				t.Fatalf("narinfo (%d) lacks %q:\n%s", resp.StatusCode, line, narinfo)
			}
		}
		key := strings.TrimPrefix(strings.Fields(c.meta.FileHash)[0], "sha256:")
		resp, err = http.Get(e.httpURL() + "/cache/main/nar/" + key + ".nar.zst")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Equal(body, c.zst) {
			t.Fatalf("NAR over HTTP: %d, %d bytes, want the uploaded %d", resp.StatusCode, len(body), len(c.zst))
		}
	})
}

func TestUploadRejectsCorruption(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		w := e.projectWorker()
		for i, corrupt := range []func(c *compressed){
			func(c *compressed) { c.zst[len(c.zst)/2] ^= 0xff },                               // a flipped byte in a chunk
			func(c *compressed) { c.meta.NarHash = compressNar(t, []byte("x")).meta.NarHash }, // wrong NAR hash
			func(c *compressed) { c.meta.FileSize++ },                                         // wrong length
		} {
			c := compressNar(t, randomNar(700<<10))
			corrupt(&c)
			path := testStorePath("bad")
			e.produce(path)
			_, out := uploadNar(t, w.Sess, uint64(i+1), path, c)
			if _, rejected := out.(*wire.UploadRejected); !rejected {
				t.Fatalf("case %d: outcome %+v, want Rejected", i, out)
			}
			hash, _ := storage.StorePathHash(path)
			if _, err := db.CachePath(t.Context(), e.Cache.ID, hash); err == nil {
				t.Fatalf("case %d: the path was recorded", i)
			}
		}
		if keys, err := e.store.Keys(); err != nil || len(keys) != 0 {
			t.Fatalf("objects stored: %v %v", keys, err)
		}
	})
}

func TestConcurrentUploadsOfOnePath(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		path := testStorePath("same")
		e.produce(path)
		nar := randomNar(2 << 20)
		var wg sync.WaitGroup
		for i := range 3 {
			w := e.projectWorker()
			wg.Go(func() {
				// Each worker compresses on its own; the objects would
				// be equal anyway, but only one upload may store.
				if _, out := uploadNar(t, w.Sess, uint64(i+1), path, compressNar(t, nar)); !isOk(out) {
					t.Errorf("worker %d: %+v", i, out)
				}
			})
		}
		wg.Wait()
		if keys, err := e.store.Keys(); err != nil || len(keys) != 1 {
			t.Fatalf("objects: %v %v", keys, err)
		}
	})
}

// A worker serving two projects uploads a job's outputs into the caches
// of that job's project only.
func TestUploadsGoToTheJobsProjectCaches(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := newCacheProtoEnv(t, db, server.Config{})
		other, err := db.CreateCache(ctx, storage.NewCache{Name: "other"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, e.Bare.ID, other.ID); err != nil {
			t.Fatal(err)
		}
		id := storage.NewID()
		w := e.MustConnect(id, map[string]string{
			e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id),
			e.Bare.ID:    e.Register(storage.PeerProject, e.Bare.ID, id),
		})
		path := testStorePath("out")
		e.produce(path)
		if _, out := uploadNar(t, w.Sess, 1, path, compressNar(t, randomNar(4096))); !isOk(out) {
			t.Fatalf("upload: %+v", out)
		}
		hash, _ := storage.StorePathHash(path)
		if _, err := db.CachePath(ctx, e.Cache.ID, hash); err != nil {
			t.Errorf("the job's project cache lacks the upload: %v", err)
		}
		if _, err := db.CachePath(ctx, other.ID, hash); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("another project's cache got the upload (%v)", err)
		}
	})
}
