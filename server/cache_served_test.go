package server

import (
	"testing"
	"time"

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
				e := newCacheProtoEnv(t, db, Config{})
				ctx := t.Context()
				older := e.putPath(t, e.cache.ID, testStorePath("older"), randomNar(4000))
				time.Sleep(5 * time.Millisecond) // distinct upload times
				newer := e.putPath(t, e.cache.ID, testStorePath("newer"), randomNar(4000))
				time.Sleep(5 * time.Millisecond)

				w := e.projectWorker()
				switch how {
				case "NarRequest":
					send(t, w.sess, &wire.NarRequest{JobID: "j", Paths: []string{older.StorePath}})
					pullStream(t, w.sess, nil)
				default:
					send(t, w.sess, &wire.CacheQuery{QueryID: "p", Paths: []string{older.StorePath}, Mode: wire.QueryPull})
					if st := recvAs[*wire.CacheStatus](t, w.sess); len(st.Cached) != 1 || !st.Cached[0].Cached {
						t.Fatalf("Pull: %+v", st)
					}
				}
				// Room for one of the two.
				max := older.FileSize + newer.FileSize - 1
				if err := db.SetCacheMaxBytes(ctx, e.cache.ID, &max); err != nil {
					t.Fatal(err)
				}
				rep, err := e.srv.collector.Run(ctx, false)
				if err != nil {
					t.Fatal(err)
				}
				if len(rep.Paths) != 1 || rep.Paths[0].StorePath != newer.StorePath {
					t.Fatalf("evicted %+v; want only the newer path nobody pulled", rep.Paths)
				}
			})
		})
	}
}
