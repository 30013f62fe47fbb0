package cache_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
)

// putObject stores nar under storePath in the env's cache, bypassing Nix.
func (e *cacheEnv) putObject(t testing.TB, storePath string, nar []byte) storage.CachePath {
	t.Helper()
	return e.putObjectIn(t, e.cache.ID, storePath, nar)
}

// putObjectIn is putObject into the cache with ID cacheID.
func (e *cacheEnv) putObjectIn(t testing.TB, cacheID, storePath string, nar []byte) storage.CachePath {
	t.Helper()
	obj, err := e.store.Put(t.Context(), bytes.NewReader(nar), nil)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := e.db.PutCachePath(t.Context(), storage.CachePath{
		CacheID: cacheID, StorePath: storePath, NarHash: obj.NarHashText(), NarSize: obj.NarSize,
		FileHash: obj.FileHashText(), FileSize: obj.FileSize, Compression: narstore.Compression, ObjectKey: obj.Key,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBinaryCacheHTTP(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	p := e.putObject(t, "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob", bytes.Repeat([]byte("nar "), 10000))
	do := func(method, path string) (*http.Response, string) {
		req, _ := http.NewRequest(method, e.url+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := do("GET", "/cache/main/nix-cache-info")
	if resp.StatusCode != 200 || body != "StoreDir: /nix/store\nWantMassQuery: 1\nPriority: 10\n" || resp.Header.Get("Content-Type") != "text/x-nix-cache-info" {
		t.Fatalf("nix-cache-info: %d %q", resp.StatusCode, body)
	}
	resp, body = do("GET", "/cache/main/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr.narinfo")
	for _, line := range []string{"StorePath: " + p.StorePath, "URL: nar/" + p.ObjectKey + ".nar.zst", "Compression: zstd",
		"FileHash: " + p.FileHash, "NarHash: " + p.NarHash, "NarSize: 40000", "Sig: gradient-test-main:"} {
		if !strings.Contains(body, line) {
			t.Errorf("narinfo lacks %q:\n%s", line, body)
		}
	}
	if strings.Contains(body, "References:") || resp.Header.Get("Content-Type") != "text/x-nix-narinfo" {
		t.Errorf("narinfo %q, type %q", body, resp.Header.Get("Content-Type"))
	}
	resp, body = do("HEAD", "/cache/main/nar/"+p.ObjectKey+".nar.zst")
	if resp.StatusCode != 200 || body != "" || resp.ContentLength != p.FileSize || resp.Header.Get("Content-Type") != "application/x-nix-nar" {
		t.Fatalf("HEAD nar: %d, length %d, body %d bytes", resp.StatusCode, resp.ContentLength, len(body))
	}
	resp, body = do("GET", "/cache/main/nar/"+p.ObjectKey+".nar.zst")
	if resp.StatusCode != 200 || int64(len(body)) != p.FileSize {
		t.Fatalf("GET nar: %d, %d bytes", resp.StatusCode, len(body))
	}
	for _, path := range []string{
		"/cache/nope/nix-cache-info",
		"/cache/main/" + strings.Repeat("1", 32) + ".narinfo",
		"/cache/main/nar/" + strings.Repeat("1", 52) + ".nar.zst",
		"/cache/main/nar/../../etc/passwd",
		"/cache/main/whatever",
	} {
		if resp, _ := do("GET", path); resp.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
		}
	}
	_, metrics := do("GET", "/metrics")
	if !strings.Contains(metrics, `gradient_cache_nar_bytes_sent_total{cache="main"} `+strconv.FormatInt(p.FileSize, 10)) {
		t.Errorf("metrics do not count the NAR bytes:\n%s", metrics)
	}
}

// BenchmarkNarDownload measures NAR throughput of the HTTP cache over
// loopback: one 16 MiB incompressible object, fetched again and again.
func BenchmarkNarDownload(b *testing.B) {
	e := newCacheEnv(b, server.Config{})
	nar := make([]byte, 16<<20)
	rand.Read(nar)
	p := e.putObject(b, "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob", nar)
	url := e.url + "/cache/main/nar/" + p.ObjectKey + ".nar.zst"
	buf := make([]byte, 256<<10)
	b.SetBytes(p.FileSize)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		if err != nil || n != p.FileSize {
			b.Fatalf("read %d of %d: %v", n, p.FileSize, err)
		}
	}
}

// A narinfo served once is kept in memory; deleting the path (or the
// cache) must still make the cache answer 404 at once, and a new upload
// of the path must be served again.
func TestBinaryCacheNarinfoAfterDelete(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	const storePath = "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob"
	narinfo := e.url + "/cache/main/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr.narinfo"
	status := func(method, url string) int {
		req, _ := http.NewRequest(method, url, nil)
		req.Header.Set("Authorization", "Bearer "+servertest.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status("GET", narinfo); got != 404 {
		t.Fatalf("narinfo before upload: %d, want 404", got)
	}
	e.putObject(t, storePath, []byte("first"))
	for range 2 {
		if got := status("GET", narinfo); got != 200 {
			t.Fatalf("narinfo after upload: %d, want 200", got)
		}
	}
	if got := status("DELETE", e.url+"/api/v1/caches/main/paths/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr"); got != 204 {
		t.Fatalf("delete: %d", got)
	}
	if got := status("GET", narinfo); got != 404 {
		t.Fatalf("narinfo after delete: %d, want 404", got)
	}
	p := e.putObject(t, storePath, []byte("second"))
	req, _ := http.NewRequest("GET", narinfo, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "NarHash: "+p.NarHash) {
		t.Fatalf("narinfo after upload again: %d\n%s\nwant NarHash %s", resp.StatusCode, body, p.NarHash)
	}
	// Deleting the whole cache forgets it at once, not a second later.
	if got := status("DELETE", e.url+"/api/v1/caches/main"); got != 204 {
		t.Fatalf("delete cache: %d", got)
	}
	for _, url := range []string{narinfo, e.url + "/cache/main/nix-cache-info"} {
		if got := status("GET", url); got != 404 {
			t.Fatalf("GET %s after the cache was deleted: %d, want 404", url, got)
		}
	}
}

// NAR downloads honour Range: a single range is 206 with Content-Range,
// an unsatisfiable one 416, and a download broken off and resumed with
// Range and If-Range adds up to the object.
func TestNarDownloadRanges(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	nar := make([]byte, 300_000)
	rand.Read(nar) // incompressible: the object is about as large
	p := e.putObject(t, "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob", nar)
	url := e.url + "/cache/main/nar/" + p.ObjectKey + ".nar.zst"
	get := func(header map[string]string) (*http.Response, []byte) {
		req, _ := http.NewRequest("GET", url, nil)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, whole := get(nil)
	if resp.StatusCode != 200 || int64(len(whole)) != p.FileSize || resp.Header.Get("Accept-Ranges") != "bytes" {
		t.Fatalf("whole object: %d, %d bytes, Accept-Ranges %q", resp.StatusCode, len(whole), resp.Header.Get("Accept-Ranges"))
	}
	etag := resp.Header.Get("ETag")
	size := strconv.FormatInt(p.FileSize, 10)

	resp, part := get(map[string]string{"Range": "bytes=100-199"})
	if resp.StatusCode != 206 || resp.Header.Get("Content-Range") != "bytes 100-199/"+size || !bytes.Equal(part, whole[100:200]) {
		t.Fatalf("bytes=100-199: %d, Content-Range %q, %d bytes", resp.StatusCode, resp.Header.Get("Content-Range"), len(part))
	}
	for _, bad := range []string{"bytes=" + size + "-", "bytes=999999999-"} {
		if resp, _ := get(map[string]string{"Range": bad}); resp.StatusCode != 416 || resp.Header.Get("Content-Range") != "bytes */"+size {
			t.Errorf("Range %s: %d, Content-Range %q; want 416", bad, resp.StatusCode, resp.Header.Get("Content-Range"))
		}
	}

	// A client that read part of the body and lost the connection resumes.
	req, _ := http.NewRequest("GET", url, nil)
	first, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 70_000)
	if _, err := io.ReadFull(first.Body, head); err != nil {
		t.Fatal(err)
	}
	first.Body.Close()
	resp, rest := get(map[string]string{"Range": "bytes=70000-", "If-Range": etag})
	if resp.StatusCode != 206 || !bytes.Equal(append(head, rest...), whole) {
		t.Fatalf("resume: %d, %d + %d bytes of %d", resp.StatusCode, len(head), len(rest), len(whole))
	}
	// If-Range naming another object gets the whole current one.
	if resp, b := get(map[string]string{"Range": "bytes=70000-", "If-Range": `"other"`}); resp.StatusCode != 200 || !bytes.Equal(b, whole) {
		t.Fatalf("stale If-Range: %d, %d bytes", resp.StatusCode, len(b))
	}
}

// Narinfos carry Access-Control-Allow-Origin: * (docs/protocol/cache.md §9).
func TestNarinfoAllowsAnyOrigin(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	e.putObject(t, "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob", []byte("nar"))
	for path, want := range map[string]int{
		"/cache/main/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr.narinfo": 200,
		"/cache/main/" + strings.Repeat("1", 32) + ".narinfo":  404,
	} {
		for _, method := range []string{"GET", "HEAD"} {
			req, _ := http.NewRequest(method, e.url+path, nil)
			req.Header.Set("Origin", "https://example.org")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
				t.Errorf("%s %s: %d, Access-Control-Allow-Origin %q", method, path, resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
			}
		}
	}
}
