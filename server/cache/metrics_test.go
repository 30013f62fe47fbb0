package cache_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
)

// /metrics answers without credentials, so a private cache's name must
// not appear there once an authorized client has used the cache.
func TestMetricsDoNotNamePrivateCaches(t *testing.T) {
	e := newCacheEnv(t, server.Config{})
	private, err := e.db.CreateCache(t.Context(), storage.NewCache{Name: "acme-internal", KeyName: "gradient-test-acme"})
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := e.db.CreateCacheKey(t.Context(), private.ID)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, auth string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", e.url+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	missing := strings.Repeat("0", 32) + ".narinfo"
	if code, _ := get("/cache/acme-internal/"+missing, "Bearer "+key); code != http.StatusNotFound {
		t.Fatalf("private narinfo with a key: %d, want 404", code)
	}
	if code, _ := get("/cache/main/"+missing, ""); code != http.StatusNotFound {
		t.Fatalf("public narinfo: %d, want 404", code)
	}
	_, body := get("/metrics", "")
	if strings.Contains(body, "acme-internal") {
		t.Errorf("/metrics names the private cache:\n%s", body)
	}
	for _, want := range []string{`cache="private",result="miss"`, `cache="main",result="miss"`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
}
