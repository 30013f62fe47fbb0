package cache_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/storepath"
	"gradient.dev/gradient/wire"
)

// fileNar is the NAR of one non-executable file.
func fileNar(contents string) []byte {
	var b []byte
	for _, s := range []string{"nix-archive-1", "(", "type", "regular", "contents", contents, ")"} {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
		b = append(b, make([]byte, (8-len(s)%8)%8)...)
	}
	return b
}

// caUpload is an upload of a content-addressed path: ca over digest,
// path computed from it, the NAR nar.
func caUpload(t *testing.T, method storepath.Method, digest [32]byte, name string, nar []byte, refs ...string) (string, compressed) {
	t.Helper()
	ca := storepath.ContentAddress{Method: method, Algo: "sha256", Digest: digest[:]}
	path, err := ca.StorePath(name, refs, false)
	if err != nil {
		t.Fatal(err)
	}
	c := compressNar(t, nar, refs...)
	text := ca.String()
	c.meta.CA = &text
	return path, c
}

// uploadAs is uploadNar under job.
func uploadAs(t *testing.T, w *servertest.Worker, job string, id uint64, path string, c compressed) wire.UploadOutcome {
	t.Helper()
	send(t, w.Sess, &wire.UploadRequest{JobID: job, RequestID: id, Object: &wire.UploadNar{StorePath: path}, Size: c.meta.NarSize})
	grant, outcome := awaitGrant(t, w.Sess, id)
	if outcome != nil {
		return outcome
	}
	if _, skip := grant.(*wire.GrantSkip); skip {
		return &wire.UploadOk{}
	}
	sendChunks(t, w.Sess, id, c.zst)
	meta := c.meta
	send(t, w.Sess, &wire.UploadFinished{RequestID: id, Metadata: &meta})
	return recvAs[*wire.UploadCommitted](t, w.Sess).Outcome
}

// rejected fails t unless out is Rejected with a reason naming each of
// words.
func rejected(t *testing.T, what string, out wire.UploadOutcome, words ...string) {
	t.Helper()
	r, ok := out.(*wire.UploadRejected)
	if !ok {
		t.Errorf("%s: outcome %+v, want Rejected", what, out)
		return
	}
	for _, w := range words {
		if !strings.Contains(r.Reason, w) {
			t.Errorf("%s: reason %q does not name %q", what, r.Reason, w)
		}
	}
}

// notStored fails t if path is in a cache of the env.
func (e *cacheProtoEnv) notStored(t *testing.T, what, path string, caches ...storage.Cache) {
	t.Helper()
	hash, _ := storage.StorePathHash(path)
	for _, c := range append(caches, e.Cache) {
		if _, err := e.DB.CachePath(t.Context(), c.ID, hash); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("%s: %s is in cache %s (%v)", what, path, c.Name, err)
		}
	}
}

// A build job uploads its outputs, and nothing else; a job the session
// does not hold, or none, uploads nothing into a project's caches.
func TestUploadsOnlyOfTheSessionsJob(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		id := storage.NewID()
		w := e.MustConnect(id, map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)})
		out, foreign := testStorePath("out"), testStorePath("foreign")
		e.jobs.set("build-a", id, authority.JobProducts{Project: e.Project.ID, What: "build of /nix/store/a.drv", Outputs: []string{out}})
		e.jobs.set("build-b", storage.NewID(), authority.JobProducts{Project: e.Project.ID, What: "build of /nix/store/b.drv", Outputs: []string{foreign}})

		rejected(t, "not an output", uploadAs(t, w, "build-a", 1, foreign, compressNar(t, randomNar(3000))),
			foreign, "not an output of job build-a", "/nix/store/a.drv")
		rejected(t, "another session's job", uploadAs(t, w, "build-b", 2, foreign, compressNar(t, randomNar(3000))),
			"no running job of this session produces "+foreign, "build-b")
		rejected(t, "no job", uploadAs(t, w, "", 3, foreign, compressNar(t, randomNar(3000))),
			"no running job of this session produces "+foreign, "names no job")
		e.notStored(t, "refused uploads", foreign)

		// A Push query without the job finds nothing to skip either.
		e.putPath(t, e.Cache.ID, foreign, randomNar(100))
		send(t, w.Sess, &wire.CacheQuery{JobID: "build-b", QueryID: "q", Paths: []string{foreign}, Mode: wire.QueryPush})
		if st := recvAs[*wire.CacheStatus](t, w.Sess); len(st.Cached) != 1 || st.Cached[0].Cached {
			t.Errorf("Push query for a job not held: %+v", st)
		}

		if got := uploadAs(t, w, "build-a", 4, out, compressNar(t, randomNar(3000))); !isOk(got) {
			t.Fatalf("the job's own output: %+v", got)
		}
		hash, _ := storage.StorePathHash(out)
		if _, err := db.CachePath(t.Context(), e.Cache.ID, hash); err != nil {
			t.Errorf("the output is not in the project's cache: %v", err)
		}
	})
}

// A worker of project A cannot put anything into project B's caches: not
// under B's jobs, which it does not hold, and not under a job of B that
// it would hold without serving B.
func TestUploadsStayInTheJobsProject(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := newCacheProtoEnv(t, db, server.Config{})
		cacheB, err := db.CreateCache(ctx, storage.NewCache{Name: "b"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, e.Bare.ID, cacheB.ID); err != nil {
			t.Fatal(err)
		}
		id := storage.NewID()
		w := e.MustConnect(id, map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)})
		path := testStorePath("b-out")
		e.jobs.set("job-of-b", storage.NewID(), authority.JobProducts{Project: e.Bare.ID, What: "build of b", Outputs: []string{path}})
		rejected(t, "B's job", uploadAs(t, w, "job-of-b", 1, path, compressNar(t, randomNar(2000))), "no running job of this session produces")
		e.jobs.set("job-of-b", id, authority.JobProducts{Project: e.Bare.ID, What: "build of b", Outputs: []string{path}})
		rejected(t, "B's job without serving B", uploadAs(t, w, "job-of-b", 2, path, compressNar(t, randomNar(2000))), "may write no cache")
		e.notStored(t, "project B", path, cacheB)
	})
}

// A fetch or evaluation uploads only self-certifying paths: the CA field
// gives the store path, and the NAR hashes to the CA's digest. Anything
// else is refused and nothing is kept.
func TestEvaluationUploadsMustCertifyThemselves(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		w := e.projectWorker()
		e.jobs.set("eval", "", authority.JobProducts{Project: e.Project.ID, What: "evaluation of x@y", ContentAddressed: true})
		dep := testStorePath("dep")
		good := "derive(...)"
		drv, drvUp := caUpload(t, storepath.Text, sha256.Sum256([]byte(good)), "good.drv", fileNar(good), dep)
		forged, forgedUp := caUpload(t, storepath.Text, sha256.Sum256([]byte(good)), "forged.drv", fileNar("derive(evil)"), dep)
		tree := randomNar(4000) // any NAR: a recursive digest is the NAR hash
		src, srcUp := caUpload(t, storepath.Recursive, sha256.Sum256(tree), "source", tree)
		fakeSrc, fakeSrcUp := caUpload(t, storepath.Recursive, sha256.Sum256([]byte("other")), "source", tree)
		flat, flatUp := caUpload(t, storepath.Flat, sha256.Sum256([]byte("data")), "data.tar", fileNar("data"))
		dir, dirUp := caUpload(t, storepath.Flat, sha256.Sum256(tree), "dir", tree)
		moved := testStorePath("good.drv")
		_, movedUp := caUpload(t, storepath.Text, sha256.Sum256([]byte(good)), "good.drv", fileNar(good), dep)
		plain := testStorePath("input-addressed")

		rejected(t, "input-addressed", uploadAs(t, w, "eval", 1, plain, compressNar(t, randomNar(2000))), plain, "not content-addressed", "evaluation of x@y")
		rejected(t, "CA of another path", uploadAs(t, w, "eval", 2, moved, movedUp), moved, "is not the path of content address")
		withoutRef := drvUp
		withoutRef.meta.References = []string{}
		rejected(t, "references not those of the path", uploadAs(t, w, "eval", 3, drv, withoutRef), "is not the path of content address")
		rejected(t, "forged text content", uploadAs(t, w, "eval", 4, forged, forgedUp), "file's sha256 hash is")
		rejected(t, "forged recursive content", uploadAs(t, w, "eval", 5, fakeSrc, fakeSrcUp), "the NAR hash is")
		rejected(t, "a directory as a flat path", uploadAs(t, w, "eval", 6, dir, dirUp), "not a single non-executable regular file")
		for _, p := range []string{plain, moved, forged, fakeSrc, dir} {
			e.notStored(t, "refused", p)
		}
		if keys, err := e.store.Keys(); err != nil || len(keys) != 0 {
			t.Fatalf("refused uploads left objects: %v %v", keys, err)
		}

		for i, ok := range []struct {
			path string
			up   compressed
		}{{drv, drvUp}, {src, srcUp}, {flat, flatUp}} {
			if out := uploadAs(t, w, "eval", uint64(10+i), ok.path, ok.up); !isOk(out) {
				t.Errorf("self-certifying %s: %+v", ok.path, out)
			}
		}
		// Stored paths stay Skip, whatever the request carries.
		if out := uploadAs(t, w, "eval", 20, src, compressNar(t, randomNar(10))); !isOk(out) {
			t.Errorf("a stored path again: %+v", out)
		}
	})
}

// A build whose outputs have no path before it runs (a content-addressed
// derivation) uploads self-certifying paths, also one that references
// itself, which Nix hashes modulo its own hash part: the real Nix's
// output is taken, the same output with a changed byte is not.
func TestContentAddressedBuildOutputs(t *testing.T) {
	n := nixtest.New(t)
	n.Config = append(slices.Clone(n.Config), "extra-experimental-features = ca-derivations")
	expr := filepath.Join(t.TempDir(), "ca.nix")
	os.WriteFile(expr, []byte(`derivation {
  name = "caout"; system = builtins.currentSystem; builder = "/bin/sh";
  args = ["-c" "PATH=/bin:/usr/bin; mkdir $out; echo $out > $out/self"];
  __contentAddressed = true; outputHashMode = "recursive"; outputHashAlgo = "sha256";
}`), 0o644)
	nixCmd := func(args ...string) string {
		cmd := exec.Command(args[0], append([]string{"--store", n.Store}, args[1:]...)...)
		cmd.Dir, cmd.Env = n.WorkDir, append(append(os.Environ(), n.Env...), "NIX_CONFIG="+strings.Join(n.Config, "\n"))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	path := nixCmd("nix-store", "--realise", nixCmd("nix-instantiate", expr))
	infos, err := n.PathInfo(t.Context(), path)
	if err != nil || len(infos) != 1 || !slices.Contains(infos[0].References, path) {
		t.Fatalf("path info of %s: %+v, %v; want a self-reference", path, infos, err)
	}
	var nar bytes.Buffer
	if err := n.DumpPath(t.Context(), path, &nar); err != nil {
		t.Fatal(err)
	}
	up := compressNar(t, nar.Bytes(), infos[0].References...)
	up.meta.CA = &infos[0].CA
	forgedNar := bytes.Clone(nar.Bytes())
	forgedNar[len(forgedNar)-30] ^= 1
	forged := compressNar(t, forgedNar, infos[0].References...)
	forged.meta.CA = &infos[0].CA

	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		w := e.projectWorker()
		e.jobs.set("ca-build", "", authority.JobProducts{Project: e.Project.ID, What: "build of caout.drv", ContentAddressed: true})
		rejected(t, "forged output", uploadAs(t, w, "ca-build", 1, path, forged), "the NAR's sha256 hash is")
		e.notStored(t, "forged output", path)
		if out := uploadAs(t, w, "ca-build", 2, path, up); !isOk(out) {
			t.Errorf("the real output: %+v", out)
		}
	})
}

// Which caches a job's uploads go to follows the admin API's subscription
// changes at once, though the server keeps each project's subscriptions
// between uploads: an unsubscribed cache takes no further upload, a
// subscribed one takes the next.
func TestUploadsFollowSubscriptionChanges(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := newCacheProtoEnv(t, db, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken)})
		second, err := db.CreateCache(ctx, storage.NewCache{Name: "second"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, e.Project.ID, second.ID); err != nil {
			t.Fatal(err)
		}
		w := e.projectWorker()
		admin := &servertest.Admin{T: t, Base: strings.TrimSuffix("http"+strings.TrimPrefix(e.URL, "ws"), "/proto"), Token: servertest.AdminToken}
		sub := servertest.ProjectPath("ops/web") + "/caches/second"
		in := func(what, path string, want ...storage.Cache) {
			t.Helper()
			hash, _ := storage.StorePathHash(path)
			for _, c := range []storage.Cache{e.Cache, second} {
				_, err := db.CachePath(ctx, c.ID, hash)
				switch {
				case slices.ContainsFunc(want, func(w storage.Cache) bool { return w.ID == c.ID }) && err != nil:
					t.Errorf("%s: cache %s lacks the upload: %v", what, c.Name, err)
				case !slices.ContainsFunc(want, func(w storage.Cache) bool { return w.ID == c.ID }) && !errors.Is(err, storage.ErrNotFound):
					t.Errorf("%s: cache %s got the upload (%v)", what, c.Name, err)
				}
			}
		}
		upload := func(id uint64, name string) string {
			t.Helper()
			path := testStorePath(name)
			e.produce(path)
			if _, out := uploadNar(t, w.Sess, id, path, compressNar(t, randomNar(1000))); !isOk(out) {
				t.Fatalf("upload of %s: %+v", name, out)
			}
			return path
		}
		in("both subscribed", upload(1, "first"), e.Cache, second)
		admin.Must(204, "DELETE", sub, nil, nil)
		in("after unsubscribing second", upload(2, "after-unsubscribe"), e.Cache)
		admin.Must(201, "PUT", sub, nil, nil)
		in("after subscribing second again", upload(3, "after-subscribe"), e.Cache, second)
	})
}
