package server_test

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
)

// privateCacheWithKey adds a private cache "secret" with one path and an
// API key, returning the path's narinfo URL and the key.
func privateCacheWithKey(t *testing.T, e *servertest.AdminEnv, store *narstore.Local) (narinfo, key string) {
	t.Helper()
	c, err := e.DB.CreateCache(t.Context(), storage.NewCache{Name: "secret", KeyName: "gradient-test-secret"})
	if err != nil {
		t.Fatal(err)
	}
	obj, err := store.Put(t.Context(), bytes.NewReader([]byte("private nar")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.DB.PutCachePath(t.Context(), storage.CachePath{
		CacheID: c.ID, StorePath: "/nix/store/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr-blob", NarHash: obj.NarHashText(), NarSize: obj.NarSize,
		FileHash: obj.FileHashText(), FileSize: obj.FileSize, Compression: narstore.Compression, ObjectKey: obj.Key,
	}); err != nil {
		t.Fatal(err)
	}
	if _, key, err = e.DB.CreateCacheKey(t.Context(), c.ID); err != nil {
		t.Fatal(err)
	}
	return e.Base + "/cache/secret/0mdqa9w1p6cmli6976v4wi0sw9r4p5pr.narinfo", key
}

// The failed-authentication limit: an address that sent too many wrong
// credentials gets 429 on the cache, its sessions and the admin API; other
// addresses are served; after the window the address is served again.
func TestFailedAuthenticationsAreLimitedPerAddress(t *testing.T) {
	t.Parallel()
	var skew atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	store, err := narstore.OpenLocal(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := servertest.NewAdminEnvWith(t, server.WithAuthClock(server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken), NarStore: store, AuthFailuresPerMinute: 3}, clock))
	if _, err := e.DB.CreateCache(t.Context(), storage.NewCache{Name: "main", Public: true, KeyName: "gradient-test-main"}); err != nil {
		t.Fatal(err)
	}
	narinfo, key := privateCacheWithKey(t, e, store)
	keys := []string{key}
	limited, other := servertest.ClientFrom("127.0.0.2"), servertest.ClientFrom("127.0.0.3")
	wrongKey := "Bearer GRAD" + strings.Repeat("x", 64)
	sessionURL := e.Base + "/cache/secret/proto"
	admin := e.Base + "/api/v1/caches"

	// Wrong keys and tokens on any surface count together.
	for _, try := range [][2]string{{narinfo, wrongKey}, {sessionURL, wrongKey}, {admin, "Bearer wrong-admin-token"}} {
		if got, _ := servertest.StatusOf(t, limited, "GET", try[0], try[1]); got != 401 {
			t.Fatalf("GET %s with a wrong credential: %d, want 401", try[0], got)
		}
	}
	for _, try := range [][2]string{
		{narinfo, "Bearer " + keys[0]}, {narinfo, wrongKey}, {sessionURL, "Bearer " + keys[0]},
		{admin, "Bearer " + servertest.AdminToken}, {admin, "Bearer wrong-admin-token"},
	} {
		got, h := servertest.StatusOf(t, limited, "GET", try[0], try[1])
		if retry, _ := strconv.Atoi(h.Get("Retry-After")); got != 429 || retry < 1 || retry > 20 {
			t.Errorf("GET %s from the limited address: %d, Retry-After %q; want 429 within one attempt's 20 s", try[0], got, h.Get("Retry-After"))
		}
	}
	// No credential, nothing to check: a public cache still answers.
	if got, _ := servertest.StatusOf(t, limited, "GET", e.Base+"/cache/main/nix-cache-info", ""); got != 200 {
		t.Errorf("public cache without a key from the limited address: %d", got)
	}
	// Other addresses are untouched, wrong keys included.
	for _, try := range [][3]string{{narinfo, "Bearer " + keys[0], "200"}, {admin, "Bearer " + servertest.AdminToken, "200"}, {narinfo, wrongKey, "401"}} {
		if got, _ := servertest.StatusOf(t, other, "GET", try[0], try[1]); strconv.Itoa(got) != try[2] {
			t.Errorf("GET %s from another address: %d, want %s", try[0], got, try[2])
		}
	}
	// A window later the limited address is served again.
	skew.Store(int64(time.Minute))
	for _, try := range [][3]string{{narinfo, "Bearer " + keys[0], "200"}, {admin, "Bearer " + servertest.AdminToken, "200"}} {
		if got, _ := servertest.StatusOf(t, limited, "GET", try[0], try[1]); strconv.Itoa(got) != try[2] {
			t.Errorf("GET %s after the window: %d, want %s", try[0], got, try[2])
		}
	}
	// ... including a real cache session from it.
	ws := "ws" + strings.TrimPrefix(e.Base, "http") + "/proto"
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for range 3 { // from 127.0.0.1: spend its attempts, then see the session refused
		servertest.StatusOf(t, http.DefaultClient, "GET", narinfo, wrongKey)
	}
	if _, err := servertest.DialCacheSession(ctx, ws, "secret", "Bearer "+keys[0]); err == nil || !strings.Contains(err.Error(), "429") {
		t.Fatalf("cache session from a limited address: %v, want HTTP 429", err)
	}
	skew.Store(int64(2 * time.Minute))
	s, err := servertest.DialCacheSession(ctx, ws, "secret", "Bearer "+keys[0])
	if err != nil {
		t.Fatalf("cache session after the window: %v", err)
	}
	s.Close(session.CloseNormal, "test over")
}
