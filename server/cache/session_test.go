package cache_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

func dialCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustCacheSession(t *testing.T, e *cacheProtoEnv, cache, auth string) *session.WorkerSession {
	t.Helper()
	s, err := servertest.DialCacheSession(dialCtx(t), e.URL, cache, auth)
	if err != nil {
		t.Fatalf("cache session: %v", err)
	}
	t.Cleanup(func() { s.Close(session.CloseNormal, "test over") })
	return s
}

func TestCacheSessionAccess(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		p := e.putPath(t, e.Cache.ID, testStorePath("p"), randomNar(4000)) // "main" is private
		pub, err := db.CreateCache(t.Context(), storage.NewCache{Name: "pub", Public: true})
		if err != nil {
			t.Fatal(err)
		}
		q := e.putPath(t, pub.ID, testStorePath("q"), randomNar(4000))

		// Public: no credentials. Scope: this cache only.
		s := mustCacheSession(t, e, "pub", "")
		send(t, s, &wire.CacheQuery{QueryID: "1", Paths: []string{q.StorePath, p.StorePath}, Mode: wire.QueryPull})
		st := recvAs[*wire.CacheStatus](t, s)
		if len(st.Cached) != 2 || !st.Cached[0].Cached || st.Cached[1].Cached {
			t.Fatalf("%+v", st)
		}
		// Paths not in this cache are skipped silently.
		send(t, s, &wire.NarRequest{Paths: []string{p.StorePath, q.StorePath}})
		if got, h := pullStream(t, s, nil); h.StorePath != q.StorePath || int64(len(got)) != q.FileSize {
			t.Fatalf("pulled %s, %d bytes", h.StorePath, len(got))
		}
		// Push and everything else: Reject 403, and the session goes on.
		send(t, s, &wire.CacheQuery{QueryID: "2", Paths: []string{q.StorePath}, Mode: wire.QueryPush})
		if r := recvAs[*wire.ServerReject](t, s); r.Code != 403 || !strings.Contains(r.Reason, "Push") {
			t.Fatalf("%+v", r)
		}
		send(t, s, &wire.UploadRequest{RequestID: 1, Object: &wire.UploadNar{StorePath: q.StorePath}, Size: 1})
		if r := recvAs[*wire.ServerReject](t, s); r.Code != 403 || !strings.Contains(r.Reason, "UploadRequest") {
			t.Fatalf("%+v", r)
		}
		send(t, s, &wire.CacheQuery{QueryID: "3", Paths: []string{q.StorePath}, Mode: wire.QueryNormal})
		if st := recvAs[*wire.CacheStatus](t, s); st.QueryID != "3" || len(st.Cached) != 1 {
			t.Fatalf("%+v", st)
		}

		// Private: no key or a wrong one → 401 on the upgrade.
		for _, auth := range []string{"", "Bearer GRADnope"} {
			if _, err := servertest.DialCacheSession(dialCtx(t), e.URL, "main", auth); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
				t.Fatalf("private cache with %q: %v", auth, err)
			}
		}
		_, key, err := db.CreateCacheKey(t.Context(), e.Cache.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, auth := range []string{"Bearer " + key, key} {
			s := mustCacheSession(t, e, "main", auth)
			send(t, s, &wire.CacheQuery{QueryID: "k", Paths: []string{p.StorePath}, Mode: wire.QueryNormal})
			if st := recvAs[*wire.CacheStatus](t, s); len(st.Cached) != 1 {
				t.Fatalf("with key: %+v", st)
			}
		}
		if _, err := servertest.DialCacheSession(dialCtx(t), e.URL, "nope", ""); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
			t.Fatalf("unknown cache: %v", err)
		}
	})
}

func TestCacheSessionLimits(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{AnonymousCacheSessionsPerIP: 2})
		if err := db.SetCachePublic(t.Context(), e.Cache.ID, true); err != nil {
			t.Fatal(err)
		}
		_, key, err := db.CreateCacheKey(t.Context(), e.Cache.ID)
		if err != nil {
			t.Fatal(err)
		}
		// Per-IP cap on anonymous sessions; keyed sessions are not capped.
		a := mustCacheSession(t, e, "main", "")
		b := mustCacheSession(t, e, "main", "")
		if _, err := servertest.DialCacheSession(dialCtx(t), e.URL, "main", ""); err == nil || !strings.Contains(err.Error(), "HTTP 503") {
			t.Fatalf("third anonymous session: %v", err)
		}
		mustCacheSession(t, e, "main", "Bearer "+key)

		a.Close(session.CloseNormal, "done")
		ctx := dialCtx(t)
		// A message over SAFE_INFLIGHT_MESSAGE_SIZE is refused by the
		// transport before it is read: close 1009, no answer decoded from it.
		paths := make([]string, 1000)
		for i := range paths {
			paths[i] = "/nix/store/" + strings.Repeat("a", 3200) // 3 MiB in all
		}
		send(t, b, &wire.CacheQuery{QueryID: "big", Paths: paths, Mode: wire.QueryNormal})
		m, err := b.Recv(ctx)
		var ce *session.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.CloseMessageTooBig {
			t.Fatalf("oversize: got %+v, %v; want close 1009", m, err)
		}
		// Permits came back: anonymous sessions open again.
		waitfor.True(t, "per-IP permits released: an anonymous session opens again", func() bool {
			s, err := servertest.DialCacheSession(dialCtx(t), e.URL, "main", "")
			if err == nil {
				t.Cleanup(func() { s.Close(session.CloseNormal, "test over") })
			}
			return err == nil
		})
	})
}

func TestCacheSessionAnonymousDisabled(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{DisableAnonymousCache: true})
		if err := db.SetCachePublic(t.Context(), e.Cache.ID, true); err != nil {
			t.Fatal(err)
		}
		if _, err := servertest.DialCacheSession(dialCtx(t), e.URL, "main", ""); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
			t.Fatalf("anonymous with anonymous access off: %v", err)
		}
	})
}

func TestCacheSessionCountsAgainstMaxConnections(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{MaxConnections: 1})
		if err := db.SetCachePublic(t.Context(), e.Cache.ID, true); err != nil {
			t.Fatal(err)
		}
		mustCacheSession(t, e, "main", "")
		if _, err := servertest.DialCacheSession(dialCtx(t), e.URL, "main", ""); err == nil || !strings.Contains(err.Error(), "HTTP 503") {
			t.Fatalf("over MaxConnections: %v", err)
		}
	})
}

func TestCacheSessionIdleClose(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{CacheSessionIdleTimeout: 50 * time.Millisecond})
		if err := db.SetCachePublic(t.Context(), e.Cache.ID, true); err != nil {
			t.Fatal(err)
		}
		s := mustCacheSession(t, e, "main", "")
		if _, err := s.Recv(dialCtx(t)); !errors.Is(err, session.ErrClosed) {
			t.Fatalf("idle session: %v", err)
		}
		waitfor.True(t, "idle close logged", func() bool { return strings.Contains(e.Logs.String(), "idle: no NAR transfer") })
	})
}

// Only CacheQuery (Normal, Pull) and NarRequest: every other message, bulk
// frames included, is answered Reject 403 and the session goes on.
func TestCacheSessionRejectsOtherMessages(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newCacheProtoEnv(t, db, server.Config{})
		if err := db.SetCachePublic(t.Context(), e.Cache.ID, true); err != nil {
			t.Fatal(err)
		}
		p := e.putPath(t, e.Cache.ID, testStorePath("p"), randomNar(4000))
		s := mustCacheSession(t, e, "main", "")
		for _, m := range []wire.ClientMessage{
			&wire.UploadChunk{RequestID: 1, Offset: 0, Data: []byte("chunk")},
			&wire.LogChunk{JobID: "j", TaskIndex: 0, Data: []byte("log")},
			&wire.UploadRequest{RequestID: 2, Object: &wire.UploadNar{StorePath: p.StorePath}, Size: 1},
			&wire.NarRequestResume{StorePath: p.StorePath},
			&wire.JobUpdate{JobID: "j", Update: &wire.JobUpdateFetching{}},
			&wire.JobCompleted{JobID: "j"},
			&wire.RequestJob{Kind: wire.JobKindBuild},
			&wire.ReauthRequest{},
			&wire.AuthResponse{},
			&wire.WorkerMetrics{},
			&wire.QueryKnownDerivations{},
		} {
			send(t, s, m)
			r := recvAs[*wire.ServerReject](t, s)
			if r.Code != 403 || !strings.HasPrefix(r.Reason, m.WireName()+" ") {
				t.Fatalf("%s answered %+v, want Reject 403 naming it", m.WireName(), r)
			}
		}
		send(t, s, &wire.CacheQuery{QueryID: "after", Paths: []string{p.StorePath}, Mode: wire.QueryNormal})
		if st := recvAs[*wire.CacheStatus](t, s); st.QueryID != "after" || len(st.Cached) != 1 || !st.Cached[0].Cached {
			t.Fatalf("query after the rejects: %+v", st)
		}
	})
}

// InitAck of a cache session grants cache only, whatever the client offers.
func TestCacheSessionGrantsCacheOnly(t *testing.T) {
	t.Parallel()
	db, err := storage.Open(t.Context(), storagetest.SQLiteURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e := newCacheProtoEnv(t, db, server.Config{})
	if err := e.DB.SetCachePublic(t.Context(), e.Cache.ID, true); err != nil {
		t.Fatal(err)
	}
	ctx := dialCtx(t)
	quiet := slog.New(slog.DiscardHandler)
	tr, err := session.Dial(ctx, strings.TrimSuffix(e.URL, "/proto")+"/cache/main/proto", session.DialOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close(session.CloseNormal, "test over")
	// A client claiming every capability, core and cache included.
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	if err := c.SendClient(ctx, &wire.InitConnection{Capabilities: handshake.AllCapabilities, ID: "reader"}); err != nil {
		t.Fatal(err)
	}
	m, err := c.RecvServer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ack, ok := m.(*wire.InitAck)
	if !ok || ack.Capabilities != (wire.GradientCapabilities{Cache: true}) || len(ack.AuthorizedPeers) != 0 {
		t.Fatalf("got %#v, want InitAck with cache only", m)
	}
}
