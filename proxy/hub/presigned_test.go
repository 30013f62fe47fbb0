package hub

import (
	"reflect"
	"testing"

	"gradient.dev/gradient/wire"
)

// Presigned transfers bypass the proxy (docs/protocol/federation.md
// "Passthrough"): Pull answers' URLs, Put and Multipart grants and the
// multipart ETags of UploadFinished cross the hub untouched, only the IDs
// remapped, so the worker moves the bytes with the object store directly.
func TestPresignedURLsPassThroughUntouched(t *testing.T) {
	h := newHub()
	a := buildWorker("a", "x86_64-linux")
	h.Join(a)
	u := attach(t, h)
	assigned(t, h, u, a, "j1")

	h.FromWorker(a, &wire.CacheQuery{JobID: "j1", QueryID: "q", Paths: []string{"/nix/store/a"}, Mode: wire.QueryPull})
	queries := upOf[*wire.CacheQuery](u.take())
	if len(queries) != 1 {
		t.Fatalf("upstream queries %+v", queries)
	}
	url := "https://s3.example.com/bucket/nars/k.nar.zst?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=abc%2Fdef"
	size, hash := uint64(42), "sha256:0000000000000000000000000000000000000000000000000000"
	entry := wire.CachedPath{Path: "/nix/store/a", Cached: true, FileSize: &size, NarSize: &size, URL: &url, NarHash: &hash, FileHash: &hash}
	u.h.Handle(&wire.CacheStatus{QueryID: queries[0].QueryID, Cached: []wire.CachedPath{entry}})
	got := of[*wire.CacheStatus](a.take())
	if len(got) != 1 || len(got[0].Cached) != 1 || !reflect.DeepEqual(got[0].Cached[0], entry) {
		t.Fatalf("the worker's Pull answer %+v, want %+v", got, entry)
	}

	for i, target := range []wire.GrantTarget{
		&wire.GrantPut{URL: url},
		&wire.PresignedMultipart{UploadID: "up-1", PartSize: 64 << 20, PartURLs: []string{url + "&partNumber=1", url + "&partNumber=2"}},
	} {
		id := uint64(10 + i)
		h.FromWorker(a, &wire.UploadRequest{JobID: "j1", RequestID: id, Object: &wire.UploadNar{StorePath: "/nix/store/out"}, Size: 10})
		reqs := upOf[*wire.UploadRequest](u.take())
		if len(reqs) != 1 {
			t.Fatalf("upstream uploads %+v", reqs)
		}
		up := reqs[0].RequestID
		u.h.Handle(&wire.UploadGrant{RequestID: up, Target: target})
		grants := of[*wire.UploadGrant](a.take())
		if len(grants) != 1 || grants[0].RequestID != id || !reflect.DeepEqual(grants[0].Target, target) {
			t.Fatalf("the worker's grant %+v, want %+v under %d", grants, target, id)
		}
		meta := &wire.NarUploadMetadata{FileHash: hash, FileSize: size, NarHash: hash, NarSize: size, References: []string{}}
		if mp, ok := target.(*wire.PresignedMultipart); ok {
			meta.Multipart = &wire.CompletedMultipart{UploadID: mp.UploadID, ETags: []string{`"e1"`, `"e2"`}}
		}
		h.FromWorker(a, &wire.UploadFinished{RequestID: id, Metadata: meta})
		fins := upOf[*wire.UploadFinished](u.take())
		if len(fins) != 1 || fins[0].RequestID != up || !reflect.DeepEqual(fins[0].Metadata, meta) {
			t.Fatalf("upstream finish %+v, want %+v under %d", fins, meta, up)
		}
		u.h.Handle(&wire.UploadCommitted{RequestID: up, Outcome: &wire.UploadOk{}})
		if c := of[*wire.UploadCommitted](a.take()); len(c) != 1 || c[0].RequestID != id {
			t.Fatalf("the worker's commit %+v", c)
		}
	}
}
