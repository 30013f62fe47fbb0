package server

import (
	"slices"
	"testing"

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
		e := newEnv(t, db, cfg)
		m := e.srv.metrics
		w := newDialedWorker(t)
		token := e.createDialed(w, storage.PeerProject, e.project.ID)
		waitfor.True(t, "a rescan counting the target", func() bool {
			return testutil.ToFloat64(m.dialTargets.WithLabelValues("not_dialed")) == 1
		})
		// Two more rescans: a loop started by either would have dialed at
		// once (a redial loop's first dial does not wait).
		for range 2 {
			before := testutil.ToFloat64(m.dialRescans)
			e.srv.RefreshDials()
			waitfor.True(t, "another rescan", func() bool { return testutil.ToFloat64(m.dialRescans) > before })
		}
		if n := w.attemptCount(); n != 0 {
			t.Fatalf("the worker saw %d dials", n)
		}
		if n := testutil.ToFloat64(m.dialAttempts.WithLabelValues("failed")) + testutil.ToFloat64(m.dialAttempts.WithLabelValues("session")); n != 0 {
			t.Fatalf("%v dial attempts counted", n)
		}
		if n := e.srv.dialer.running.Load(); n != 0 {
			t.Fatalf("%d redial loops running", n)
		}
		if dialing := testutil.ToFloat64(m.dialTargets.WithLabelValues("dialing")); dialing != 0 {
			t.Fatalf("%v targets dialing", dialing)
		}
		if st := e.srv.WorkerStatus(w.id); st.Live || st.OfflineReason != notDialedReason {
			t.Fatalf("status %+v, want offline with the reason", st)
		}

		wk := e.mustConnect(w.id, map[string]string{e.project.ID: token})
		if !slices.Equal(wk.est.AuthorizedPeers, []string{e.project.ID}) {
			t.Fatalf("the worker connecting itself: authorized %v", wk.est.AuthorizedPeers)
		}
		if st := e.srv.WorkerStatus(w.id); !st.Live {
			t.Fatalf("status %+v, want live", st)
		}
	})
}

// The default (discoverable): the same registration is dialed, and the
// metrics count the target and the dial's session.
func TestDiscoverableDials(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newEnv(t, db, dialConfig(t))
		m := e.srv.metrics
		w := newDialedWorker(t)
		e.registerDialed(w, storage.PeerProject, e.project.ID)
		sess := w.session()
		if dialing := testutil.ToFloat64(m.dialTargets.WithLabelValues("dialing")); dialing != 1 {
			t.Fatalf("%v targets dialing, want 1", dialing)
		}
		sess.Close(session.CloseNormal, "worker stopping")
		waitfor.True(t, "the dial's session counted", func() bool {
			return testutil.ToFloat64(m.dialAttempts.WithLabelValues("session")) >= 1
		})
		if n := testutil.ToFloat64(m.dialTargets.WithLabelValues("not_dialed")); n != 0 {
			t.Fatalf("%v targets not dialed", n)
		}
	})
}
