package cache_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// privateCacheWithKeys adds a private cache "secret" with one path and n
// API keys to e, returning the cache, the path's narinfo URL and the keys.
func (e *cacheEnv) privateCacheWithKeys(t testing.TB, n int) (storage.Cache, string, []string) {
	t.Helper()
	c, err := e.db.CreateCache(t.Context(), storage.NewCache{Name: "secret", KeyName: "gradient-test-secret"})
	if err != nil {
		t.Fatal(err)
	}
	e.putObjectIn(t, c.ID, "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob", []byte("private nar"))
	keys := make([]string, n)
	for i := range keys {
		if _, keys[i], err = e.db.CreateCacheKey(t.Context(), c.ID); err != nil {
			t.Fatal(err)
		}
	}
	return c, e.url + "/cache/secret/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr.narinfo", keys
}

// Keys are found by their digest: every key of a cache with ten works,
// a wrong one, another cache's and a revoked one do not, on both engines.
func TestCacheKeysOverHTTP(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheEnvOn(t, db, server.Config{AuthFailuresPerMinute: -1})
		c, narinfo, keys := e.privateCacheWithKeys(t, 10)
		client := http.DefaultClient
		for i, key := range keys {
			if got, _ := servertest.StatusOf(t, client, "GET", narinfo, "Bearer "+key); got != 200 {
				t.Errorf("key %d of 10: %d, want 200", i, got)
			}
		}
		_, otherKey, err := db.CreateCacheKey(t.Context(), e.cache.ID) // of the public cache "main"
		if err != nil {
			t.Fatal(err)
		}
		wrong := keys[3][:len(keys[3])-4] + "AAAA"
		for name, auth := range map[string]string{"wrong": "Bearer " + wrong, "another cache's": "Bearer " + otherKey, "none": ""} {
			if got, _ := servertest.StatusOf(t, client, "GET", narinfo, auth); got != 401 {
				t.Errorf("%s key: %d, want 401", name, got)
			}
		}
		k, err := db.CacheKeyByToken(t.Context(), c.ID, strings.TrimPrefix(keys[0], storage.CacheKeyPrefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteCacheKey(t.Context(), c.ID, k.ID); err != nil {
			t.Fatal(err)
		}
		if got, _ := servertest.StatusOf(t, client, "GET", narinfo, "Bearer "+keys[0]); got != 401 {
			t.Errorf("revoked key: %d, want 401 at once", got)
		}
	})
}

// The limit off (AuthFailuresPerMinute < 0): wrong keys stay 401.
func TestFailedAuthenticationLimitDisabled(t *testing.T) {
	t.Parallel()
	e := newCacheEnv(t, server.Config{AuthFailuresPerMinute: -1})
	_, narinfo, _ := e.privateCacheWithKeys(t, 1)
	for i := range 50 {
		if got, _ := servertest.StatusOf(t, http.DefaultClient, "GET", narinfo, "Bearer GRADwrong"); got != 401 {
			t.Fatalf("wrong key %d with the limit disabled: %d", i, got)
		}
	}
}

// BenchmarkWrongCacheKey measures one narinfo request to a private cache
// with a wrong key, against caches of 1 and 10 keys (and a right key for
// comparison): the cost must not grow with the keys. The failure limit is
// off so every request checks its key.
func BenchmarkWrongCacheKey(b *testing.B) {
	for _, n := range []int{1, 10} {
		e := newCacheEnv(b, server.Config{AuthFailuresPerMinute: -1})
		_, narinfo, keys := e.privateCacheWithKeys(b, n)
		handler := e.srv.Handler()
		for _, c := range []struct{ name, key string }{{"wrong", "GRAD" + strings.Repeat("w", 64)}, {"right", keys[n-1]}} {
			b.Run(fmt.Sprintf("keys=%d/%s", n, c.name), func(b *testing.B) {
				req := httptest.NewRequest("GET", narinfo, nil)
				req.Header.Set("Authorization", "Bearer "+c.key)
				b.ReportAllocs()
				for b.Loop() {
					rec := httptest.NewRecorder()
					handler.ServeHTTP(rec, req)
					if want := map[string]int{"wrong": 401, "right": 200}[c.name]; rec.Code != want {
						b.Fatalf("status %d, want %d", rec.Code, want)
					}
				}
			})
		}
	}
}
