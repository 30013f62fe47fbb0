package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
)

// Short leases, so a dead instance's claims run out within the test.
const (
	testSessionRenewal = 100 * time.Millisecond
	testSessionLease   = 2 * time.Second
)

// twoInstances is two servers, each with its own connection pool, on one
// PostgreSQL database, as two processes behind a load balancer would be.
func twoInstances(t *testing.T) (a, b *servertest.Env) {
	t.Helper()
	dbURL := sqldbtest.PostgresURL(t)
	open := func() *storage.DB {
		db, err := storage.Open(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	cfg := func(id string) server.Config {
		return server.Config{InstanceID: id, SessionRenewal: testSessionRenewal, SessionLease: testSessionLease,
			AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken)}
	}
	a = servertest.NewEnv(t, open(), cfg("instance-a"))
	b = a.Sibling(open(), cfg("instance-b"))
	for _, e := range []*servertest.Env{a, b} {
		select {
		case <-e.Srv.ClaimsListening():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never listened for session notes", e.Srv.InstanceID())
		}
	}
	return a, b
}

// pump reads w's session in the background, as a live worker does (so it
// answers the server's pings), and hands over what it reads.
func pump(w *servertest.Worker) <-chan wire.ServerMessage {
	out := make(chan wire.ServerMessage, 16)
	go func() {
		defer close(out)
		for {
			m, err := w.Sess.Recv(context.Background())
			if err != nil {
				return
			}
			out <- m
		}
	}()
	return out
}

func next(t *testing.T, in <-chan wire.ServerMessage) wire.ServerMessage {
	t.Helper()
	select {
	case m, ok := <-in:
		if !ok {
			t.Fatal("the worker's session ended")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10 s")
	}
	return nil
}

// A worker ID holds one session across instances: a second connection to
// the other instance gets 496 and the first session stays; the other
// instance lists the session (on which instance, for which projects) and
// its reauth reaches the session where it lives.
func TestSessionsAcrossInstances(t *testing.T) {
	t.Parallel()
	a, b := twoInstances(t)
	id := storage.NewID()
	token := a.Register(storage.PeerProject, a.Project.ID, id)
	tokens := map[string]string{a.Project.ID: token}
	w := a.MustConnect(id, tokens)
	msgs := pump(w)

	b.ExpectReject(id, tokens, 496, "worker already connected")
	if !a.Srv.AuthorityWorkerStatus(id).Live {
		t.Fatal("the session on instance A did not survive the connection to B")
	}
	// Again on A itself: the in-memory rule, as before.
	a.ExpectReject(id, tokens, 496, "worker already connected")

	// B shows A's session, live, with A's name and the project.
	st := b.Srv.WorkerStatus(id)
	if !st.Live || st.Instance != "instance-a" || !slices.Equal(st.Projects, []string{a.Project.ID}) {
		t.Fatalf("B's view of the worker: %+v", st)
	}
	var listed []admin.ProjectWorker
	b.Admin().Must(200, "GET", servertest.ProjectPath(a.Project.ID)+"/workers", nil, &listed)
	if len(listed) != 1 || !listed[0].Live || listed[0].Instance != "instance-a" {
		t.Fatalf("B's worker list: %+v", listed)
	}

	// A registration made through B's admin API reauths the session on A.
	var cred admin.NewCredential
	b.Admin().Must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": a.Cache.Name, "worker_id": id}, &cred)
	a.Remember(cred.Token)
	if !cred.Reauthorized {
		t.Error("B did not report the session on A reauthorized")
	}
	ch, ok := next(t, msgs).(*wire.AuthChallenge)
	if !ok || !slices.Contains(ch.Peers, a.Cache.ID) {
		t.Fatalf("challenge %#v", ch)
	}
	w.Tokens[a.Cache.ID] = cred.Token
	w.Sess.Send(w.Auth.Answer(ch))
	if up, ok := next(t, msgs).(*wire.AuthUpdate); !ok || !slices.Contains(up.AuthorizedPeers, a.Cache.ID) {
		t.Fatalf("update %#v", up)
	}
	// The renewal carries the new grant to B's view.
	waitfor.True(t, "B's view of the new grant", func() bool {
		return slices.Contains(b.Srv.WorkerStatus(id).Projects, a.Project.ID) && b.Srv.WorkerStatus(id).Live
	})

	// A clean close frees the worker ID at once (no lease to wait for).
	w.Sess.Close(session.CloseNormal, "moving to B")
	waitfor.True(t, "A releasing the worker ID", func() bool { return !b.Srv.WorkerStatus(id).Live })
	w2 := b.MustConnect(id, w.Tokens)
	msgs2 := pump(w2)
	if st := a.Srv.WorkerStatus(id); !st.Live || st.Instance != "instance-b" {
		t.Fatalf("A's view of the session on B: %+v", st)
	}

	// Deactivated through A, the worker's session on B ends at once.
	a.Admin().Must(200, "POST", "/api/v1/workers/"+id+"/deactivate", nil, nil)
	deadline := time.After(10 * time.Second)
	for ended := false; !ended; {
		select {
		case _, open := <-msgs2:
			ended = !open
		case <-deadline:
			t.Fatal("the session on B outlived the deactivation on A")
		}
	}
	waitfor.True(t, "B freeing the deactivated worker", func() bool { return !b.Srv.AuthorityHolds(id) })
}

// A holder on another instance that no longer answers (its socket died
// half-open) is probed by its own instance when the worker connects to
// the other: that attempt still gets 496, the next one wins.
func TestSessionsProbeAcrossInstances(t *testing.T) {
	t.Parallel()
	a, b := twoInstances(t)
	id := storage.NewID()
	token := a.Register(storage.PeerProject, a.Project.ID, id)
	tokens := map[string]string{a.Project.ID: token}
	a.MustConnect(id, tokens) // never read: it answers no ping

	b.ExpectReject(id, tokens, 496, "worker already connected")
	if a.Srv.AuthorityHolds(id) {
		t.Fatal("A kept the session that did not answer B's probe")
	}
	w := b.MustConnect(id, tokens)
	pump(w)
	if st := a.Srv.WorkerStatus(id); !st.Live || st.Instance != "instance-b" {
		t.Fatalf("A's view after the reconnect: %+v", st)
	}
}

// An instance that dies (here: its database connections gone, then its
// process's sessions) releases nothing: its claims stay until their lease
// runs out, then its worker connects to the other instance.
func TestSessionsOfDeadInstanceExpire(t *testing.T) {
	t.Parallel()
	a, b := twoInstances(t)
	id := storage.NewID()
	token := a.Register(storage.PeerProject, a.Project.ID, id)
	tokens := map[string]string{a.Project.ID: token}
	pump(a.MustConnect(id, tokens))
	waitfor.True(t, "the claim on A", func() bool { return b.Srv.WorkerStatus(id).Instance == "instance-a" })

	a.DB.Close() // no renewal, no release, no notes any more
	a.Srv.Close()
	if st := b.Srv.WorkerStatus(id); !st.Live || st.Instance != "instance-a" {
		t.Fatalf("the dead instance's claim went before its lease: %+v", st)
	}
	waitfor.True(t, "the dead instance's lease running out", func() bool { return !b.Srv.WorkerStatus(id).Live })
	w := b.MustConnect(id, tokens)
	pump(w)
	if st := b.Srv.WorkerStatus(id); !st.Live || st.Instance != "instance-b" {
		t.Fatalf("after the lease: %+v", st)
	}
}
