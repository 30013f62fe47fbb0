package server_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// Two instances on one PostgreSQL database and a worker registered with a
// URL: exactly one instance dials it (the other sees the worker's dial
// lease held); when that instance stops, the other dials it.
func TestDialedWorkerIsDialedByOneInstance(t *testing.T) {
	t.Parallel()
	url := storagetest.PostgresURL(t)
	insts := newServerInstances(t, url, 2, dialConfig(t))
	ctx := t.Context()
	cache, err := insts[0].db.CreateCache(ctx, storage.NewCache{Name: "main"})
	if err != nil {
		t.Fatal(err)
	}
	w := newDialedWorker(t)
	w.down.Store(true) // no dial before the worker accepts the token
	settings := storage.DefaultWorkerSettings()
	settings.URL = w.url
	_, token, err := insts[0].srv.CreateRegistration(ctx, storage.Peer{Kind: storage.PeerCache, ID: cache.ID}, w.id, settings)
	if err != nil {
		t.Fatal(err)
	}
	w.accept(cache.ID, token)
	before := w.attemptCount()
	w.down.Store(false)
	for _, si := range insts {
		si.srv.RefreshDials()
	}
	first := w.session()
	var dialer, other *serverInstance
	waitfor.True(t, "an instance holding the dialed session", func() bool {
		for i, si := range insts {
			if si.srv.LiveSession(w.id) != nil {
				dialer, other = si, insts[1-i]
				return true
			}
		}
		return false
	})
	// The other instance keeps asking for the lease (each ask counted),
	// and never dials.
	elsewhere := other.srv.DialMetrics().Attempts.WithLabelValues("elsewhere")
	waitfor.True(t, "the other instance finding the lease held three times", func() bool { return testutil.ToFloat64(elsewhere) >= 3 })
	if n := w.attemptCount() - before; n != 1 {
		t.Fatalf("the worker saw %d dials while one instance held its session, want 1", n)
	}

	// The dialing instance stops: its session ends, its lease is
	// released, and the other dials the worker.
	dialer.srv.Close()
	expectClosed(t, first)
	w.session()
	waitfor.True(t, "the other instance holding the session", func() bool { return other.srv.LiveSession(w.id) != nil })
}
