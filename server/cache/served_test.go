package cache_test

import (
	"testing"
	"time"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/adminapi"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// Paths pulled over a worker session count as served for the size cap's
// least-recently-served order, like narinfos fetched over HTTP: the older
// path that a worker pulled stays, the newer one nobody asked for goes.
func TestSessionPullsCountAsServedForTheSizeCap(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"NarRequest", "Pull query"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
				e := newCacheProtoEnv(t, db, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken)})
				ctx := t.Context()
				older := e.putPath(t, e.Cache.ID, testStorePath("older"), randomNar(4000))
				time.Sleep(5 * time.Millisecond) // distinct upload times
				newer := e.putPath(t, e.Cache.ID, testStorePath("newer"), randomNar(4000))
				time.Sleep(5 * time.Millisecond)

				w := e.projectWorker()
				switch how {
				case "NarRequest":
					send(t, w.Sess, &wire.NarRequest{JobID: "j", Paths: []string{older.StorePath}})
					pullStream(t, w.Sess, nil)
				default:
					send(t, w.Sess, &wire.CacheQuery{QueryID: "p", Paths: []string{older.StorePath}, Mode: wire.QueryPull})
					if st := recvAs[*wire.CacheStatus](t, w.Sess); len(st.Cached) != 1 || !st.Cached[0].Cached {
						t.Fatalf("Pull: %+v", st)
					}
				}
				// Room for one of the two.
				max := older.FileSize + newer.FileSize - 1
				if err := db.SetCacheMaxBytes(ctx, e.Cache.ID, &max); err != nil {
					t.Fatal(err)
				}
				var rep adminapi.GCReport
				admin := &servertest.Admin{T: t, Base: e.httpURL(), Token: servertest.AdminToken}
				admin.Must(200, "POST", "/api/v1/gc", nil, &rep)
				if len(rep.Paths) != 1 || rep.Paths[0].StorePath != newer.StorePath {
					t.Fatalf("evicted %+v; want only the newer path nobody pulled", rep.Paths)
				}
			})
		})
	}
}
