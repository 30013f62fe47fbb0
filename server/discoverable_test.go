package server_test

import (
	"slices"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// proto.discoverable=false: a registration with a URL is kept but never
// dialed, through rescans that saw it; the worker connecting itself
// with the registration's token gets in.
func TestNotDiscoverableNeverDials(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		cfg := dialConfig(t)
		cfg.DisableDialing = true
		e := servertest.NewEnv(t, db, cfg)
		m := e.Srv.DialMetrics()
		w := newDialedWorker(t)
		token := createDialed(e, w, storage.PeerProject, e.Project.ID)
		waitfor.True(t, "a rescan counting the target", func() bool {
			return testutil.ToFloat64(m.Targets.WithLabelValues("not_dialed")) == 1
		})
		// Two more rescans: a loop started by either would have dialed at
		// once (a redial loop's first dial does not wait).
		for range 2 {
			before := testutil.ToFloat64(m.Rescans)
			e.Srv.RefreshDials()
			waitfor.True(t, "another rescan", func() bool { return testutil.ToFloat64(m.Rescans) > before })
		}
		if n := w.attemptCount(); n != 0 {
			t.Fatalf("the worker saw %d dials", n)
		}
		if n := testutil.ToFloat64(m.Attempts.WithLabelValues("failed")) + testutil.ToFloat64(m.Attempts.WithLabelValues("session")); n != 0 {
			t.Fatalf("%v dial attempts counted", n)
		}
		if n := e.Srv.DialsRunning(); n != 0 {
			t.Fatalf("%d redial loops running", n)
		}
		if dialing := testutil.ToFloat64(m.Targets.WithLabelValues("dialing")); dialing != 0 {
			t.Fatalf("%v targets dialing", dialing)
		}
		if st := e.Srv.WorkerStatus(w.id); st.Live || st.OfflineReason != server.NotDialedReason {
			t.Fatalf("status %+v, want offline with the reason", st)
		}

		wk := e.MustConnect(w.id, map[string]string{e.Project.ID: token})
		if !slices.Equal(wk.Est.AuthorizedPeers, []string{e.Project.ID}) {
			t.Fatalf("the worker connecting itself: authorized %v", wk.Est.AuthorizedPeers)
		}
		if st := e.Srv.WorkerStatus(w.id); !st.Live {
			t.Fatalf("status %+v, want live", st)
		}
	})
}

// The default (discoverable): the same registration is dialed, and the
// metrics count the target and the dial's session.
func TestDiscoverableDials(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, dialConfig(t))
		m := e.Srv.DialMetrics()
		w := newDialedWorker(t)
		registerDialed(e, w, storage.PeerProject, e.Project.ID)
		sess := w.session()
		if dialing := testutil.ToFloat64(m.Targets.WithLabelValues("dialing")); dialing != 1 {
			t.Fatalf("%v targets dialing, want 1", dialing)
		}
		sess.Close(session.CloseNormal, "worker stopping")
		waitfor.True(t, "the dial's session counted", func() bool {
			return testutil.ToFloat64(m.Attempts.WithLabelValues("session")) >= 1
		})
		if n := testutil.ToFloat64(m.Targets.WithLabelValues("not_dialed")); n != 0 {
			t.Fatalf("%v targets not dialed", n)
		}
	})
}
