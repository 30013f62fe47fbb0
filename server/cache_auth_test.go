package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/session"
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

// clientFrom is an HTTP client whose connections leave from the loopback
// address ip (Linux routes all of 127/8 to lo).
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// statusOf sends method url with an Authorization value ("" for none).
func statusOf(t *testing.T, client *http.Client, method, url, auth string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// Keys are found by their digest: every key of a cache with ten works,
// a wrong one, another cache's and a revoked one do not, on both engines.
func TestCacheKeysOverHTTP(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheEnvOn(t, db, Config{AuthFailuresPerMinute: -1})
		c, narinfo, keys := e.privateCacheWithKeys(t, 10)
		client := http.DefaultClient
		for i, key := range keys {
			if got, _ := statusOf(t, client, "GET", narinfo, "Bearer "+key); got != 200 {
				t.Errorf("key %d of 10: %d, want 200", i, got)
			}
		}
		_, otherKey, err := db.CreateCacheKey(t.Context(), e.cache.ID) // of the public cache "main"
		if err != nil {
			t.Fatal(err)
		}
		wrong := keys[3][:len(keys[3])-4] + "AAAA"
		for name, auth := range map[string]string{"wrong": "Bearer " + wrong, "another cache's": "Bearer " + otherKey, "none": ""} {
			if got, _ := statusOf(t, client, "GET", narinfo, auth); got != 401 {
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
		if got, _ := statusOf(t, client, "GET", narinfo, "Bearer "+keys[0]); got != 401 {
			t.Errorf("revoked key: %d, want 401 at once", got)
		}
	})
}

// The failed-authentication limit: an address that sent too many wrong
// credentials gets 429 on the cache, its sessions and the admin API; other
// addresses are served; after the window the address is served again.
func TestFailedAuthenticationsAreLimitedPerAddress(t *testing.T) {
	t.Parallel()
	var skew atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	e := newCacheEnv(t, Config{AuthFailuresPerMinute: 3, authClock: clock})
	_, narinfo, keys := e.privateCacheWithKeys(t, 1)
	limited, other := clientFrom("127.0.0.2"), clientFrom("127.0.0.3")
	wrongKey := "Bearer GRAD" + strings.Repeat("x", 64)
	sessionURL := e.url + "/cache/secret/proto"
	admin := e.url + "/api/v1/caches"

	// Wrong keys and tokens on any surface count together.
	for _, try := range [][2]string{{narinfo, wrongKey}, {sessionURL, wrongKey}, {admin, "Bearer wrong-admin-token"}} {
		if got, _ := statusOf(t, limited, "GET", try[0], try[1]); got != 401 {
			t.Fatalf("GET %s with a wrong credential: %d, want 401", try[0], got)
		}
	}
	for _, try := range [][2]string{
		{narinfo, "Bearer " + keys[0]}, {narinfo, wrongKey}, {sessionURL, "Bearer " + keys[0]},
		{admin, "Bearer " + testAdminToken}, {admin, "Bearer wrong-admin-token"},
	} {
		got, h := statusOf(t, limited, "GET", try[0], try[1])
		if retry, _ := strconv.Atoi(h.Get("Retry-After")); got != 429 || retry < 1 || retry > 20 {
			t.Errorf("GET %s from the limited address: %d, Retry-After %q; want 429 within one attempt's 20 s", try[0], got, h.Get("Retry-After"))
		}
	}
	// No credential, nothing to check: a public cache still answers.
	if got, _ := statusOf(t, limited, "GET", e.url+"/cache/main/nix-cache-info", ""); got != 200 {
		t.Errorf("public cache without a key from the limited address: %d", got)
	}
	// Other addresses are untouched, wrong keys included.
	for _, try := range [][3]string{{narinfo, "Bearer " + keys[0], "200"}, {admin, "Bearer " + testAdminToken, "200"}, {narinfo, wrongKey, "401"}} {
		if got, _ := statusOf(t, other, "GET", try[0], try[1]); strconv.Itoa(got) != try[2] {
			t.Errorf("GET %s from another address: %d, want %s", try[0], got, try[2])
		}
	}
	// A window later the limited address is served again.
	skew.Store(int64(time.Minute))
	for _, try := range [][3]string{{narinfo, "Bearer " + keys[0], "200"}, {admin, "Bearer " + testAdminToken, "200"}} {
		if got, _ := statusOf(t, limited, "GET", try[0], try[1]); strconv.Itoa(got) != try[2] {
			t.Errorf("GET %s after the window: %d, want %s", try[0], got, try[2])
		}
	}
	// ... including a real cache session from it.
	ws := "ws" + strings.TrimPrefix(e.url, "http") + "/proto"
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for range 3 { // from 127.0.0.1: spend its attempts, then see the session refused
		statusOf(t, http.DefaultClient, "GET", narinfo, wrongKey)
	}
	if _, err := dialCacheSession(ctx, ws, "secret", "Bearer "+keys[0]); err == nil || !strings.Contains(err.Error(), "429") {
		t.Fatalf("cache session from a limited address: %v, want HTTP 429", err)
	}
	skew.Store(int64(2 * time.Minute))
	s, err := dialCacheSession(ctx, ws, "secret", "Bearer "+keys[0])
	if err != nil {
		t.Fatalf("cache session after the window: %v", err)
	}
	s.Close(session.CloseNormal, "test over")
}

// The limit off (AuthFailuresPerMinute < 0): wrong keys stay 401.
func TestFailedAuthenticationLimitDisabled(t *testing.T) {
	t.Parallel()
	e := newCacheEnv(t, Config{AuthFailuresPerMinute: -1})
	_, narinfo, _ := e.privateCacheWithKeys(t, 1)
	for i := range 50 {
		if got, _ := statusOf(t, http.DefaultClient, "GET", narinfo, "Bearer GRADwrong"); got != 401 {
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
		e := newCacheEnv(b, Config{AuthFailuresPerMinute: -1})
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
