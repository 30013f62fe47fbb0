package server_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

func TestWorkerConnects(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		token := e.Register(storage.PeerProject, e.Project.ID, id)
		w := e.MustConnect(id, map[string]string{e.Project.ID: token})

		if !slices.Equal(w.Est.AuthorizedPeers, []string{e.Project.ID}) || len(w.Est.FailedPeers) != 0 {
			t.Fatalf("InitAck authorized %v failed %v", w.Est.AuthorizedPeers, w.Est.FailedPeers)
		}
		caps := w.Est.Capabilities
		if !caps.Core || !caps.Cache || !caps.Build || !caps.Eval || !caps.Fetch || caps.Federate {
			t.Errorf("negotiated %+v", caps)
		}
		st := e.Srv.WorkerStatus(id)
		if !st.Live || !slices.Equal(st.Projects, []string{e.Project.ID}) {
			t.Errorf("status %+v", st)
		}
		// Live only for the project it authenticated for.
		list, err := e.Srv.ProjectWorkers(t.Context(), e.Project.ID)
		if err != nil || len(list) != 1 || !list[0].Live {
			t.Fatalf("project workers %+v %v", list, err)
		}
		// An empty job list is one final page.
		if err := w.Sess.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		if page, ok := w.Recv(t).(*wire.JobListChunk); !ok || !page.IsFinal {
			t.Fatalf("got %#v", page)
		}
	})
}

func TestRejections(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := servertest.NewEnv(t, db, server.Config{})

		unknown := storage.NewID()
		e.ExpectReject(unknown, nil, 403, "unknown worker")
		if e.Srv.AuthForTest().HasOfflineReason(unknown) {
			t.Error("a failure of an unregistered worker ID was kept")
		}

		wrong := storage.NewID()
		e.Register(storage.PeerProject, e.Project.ID, wrong)
		e.ExpectReject(wrong, map[string]string{e.Project.ID: "not-the-token"}, 401, "no valid peer tokens provided")
		// The server keeps the reason right after sending the Reject.
		waitfor.True(t, "the offline reason", func() bool {
			return strings.Contains(e.Srv.WorkerStatus(wrong).OfflineReason, "no valid peer tokens provided")
		})

		noCache := storage.NewID()
		tok := e.Register(storage.PeerProject, e.Bare.ID, noCache)
		e.ExpectReject(noCache, map[string]string{e.Bare.ID: tok}, 495, "project has no cache subscribed")

		off := storage.NewID()
		tok = e.Register(storage.PeerProject, e.Project.ID, off)
		if err := db.DeactivateWorker(ctx, off); err != nil {
			t.Fatal(err)
		}
		e.ExpectReject(off, map[string]string{e.Project.ID: tok}, 403, "worker is deactivated")

		teamWorker := storage.NewID()
		other, err := db.CreateTeam(ctx, "nobody-grants")
		if err != nil {
			t.Fatal(err)
		}
		_, tok, err = db.CreateTeamWorker(ctx, other.ID, teamWorker, storage.DefaultWorkerSettings())
		if err != nil {
			t.Fatal(err)
		}
		e.Remember(tok)
		e.ExpectReject(teamWorker, map[string]string{other.ID: tok}, 403, "no project grants this team's workers")

		dup := storage.NewID()
		tok = e.Register(storage.PeerProject, e.Project.ID, dup)
		holder := e.MustConnect(dup, map[string]string{e.Project.ID: tok})
		// A live worker keeps reading its session, so it answers the
		// server's probe of the holder that a second connection triggers.
		go func() {
			for {
				if _, err := holder.Sess.Recv(context.Background()); err != nil {
					return
				}
			}
		}()
		e.ExpectReject(dup, map[string]string{e.Project.ID: tok}, 496, "worker already connected")
		if !e.Srv.WorkerStatus(dup).Live {
			t.Error("the first session did not survive the second connection")
		}

		e.Srv.SetAccepting(false)
		later := storage.NewID()
		tok = e.Register(storage.PeerProject, e.Project.ID, later)
		e.ExpectReject(later, map[string]string{e.Project.ID: tok}, 403, "server is not accepting connections")
		e.Srv.SetAccepting(true)
		e.MustConnect(later, map[string]string{e.Project.ID: tok})

		e.AssertNoSecretLogged()
	})
}

func TestPartialFailureKeepsSession(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		good := e.Register(storage.PeerProject, e.Project.ID, id)
		e.Register(storage.PeerProject, e.Bare.ID, id)
		w := e.MustConnect(id, map[string]string{e.Project.ID: good, e.Bare.ID: "wrong"})
		if !slices.Equal(w.Est.AuthorizedPeers, []string{e.Project.ID}) ||
			!slices.Equal(w.Est.FailedPeers, []wire.FailedPeer{{PeerID: e.Bare.ID, Reason: "invalid token"}}) {
			t.Fatalf("authorized %v failed %v", w.Est.AuthorizedPeers, w.Est.FailedPeers)
		}
	})
}

// A peer registering a live worker challenges it again; the new peer joins
// without a reconnect, and nothing granted is revoked.
func TestReauth(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		first := e.Register(storage.PeerProject, e.Project.ID, id)
		w := e.MustConnect(id, map[string]string{e.Project.ID: first})

		// Server-initiated: a cache registers the worker.
		cacheToken := e.Register(storage.PeerCache, e.Cache.ID, id)
		if !e.Srv.Reauth(id) {
			t.Fatal("no live session to reauth")
		}
		ch, ok := w.Recv(t).(*wire.AuthChallenge)
		if !ok || !slices.Contains(ch.Peers, e.Cache.ID) || !slices.Contains(ch.Peers, e.Project.ID) {
			t.Fatalf("challenge %#v", ch)
		}
		if n := e.Srv.AuthForTest().Reauths("server", "sent"); n != 1 {
			t.Errorf("server-initiated reauths counted %v, want 1", n)
		}
		w.Tokens[e.Cache.ID] = cacheToken
		if err := w.Sess.Send(w.Auth.Answer(ch)); err != nil {
			t.Fatal(err)
		}
		up, ok := w.Recv(t).(*wire.AuthUpdate)
		if !ok || !slices.Contains(up.AuthorizedPeers, e.Cache.ID) || !slices.Contains(up.AuthorizedPeers, e.Project.ID) {
			t.Fatalf("update %#v", up)
		}

		// Worker-initiated: the bare project subscribes to a cache and
		// registers the worker; the worker's peers file changed.
		bareToken := e.Register(storage.PeerProject, e.Bare.ID, id)
		if _, err := db.SubscribeProject(ctx, e.Bare.ID, e.Cache.ID); err != nil {
			t.Fatal(err)
		}
		tokens := map[string]string{e.Project.ID: "rotated-and-now-wrong", e.Bare.ID: bareToken, e.Cache.ID: cacheToken}
		if err := w.Auth.RequestReauth(w.Sess, tokens); err != nil {
			t.Fatal(err)
		}
		ch, ok = w.Recv(t).(*wire.AuthChallenge)
		if !ok {
			t.Fatalf("got %#v", ch)
		}
		// Counted once the challenge is out, which may be after it arrives.
		waitfor.True(t, "the worker-initiated reauth counted", func() bool {
			return e.Srv.AuthForTest().Reauths("worker", "sent") == 1
		})
		w.Sess.Send(w.Auth.Answer(ch))
		up, ok = w.Recv(t).(*wire.AuthUpdate)
		if !ok || !slices.Contains(up.AuthorizedPeers, e.Bare.ID) {
			t.Fatalf("update %#v", up)
		}
		// The project whose token now fails stays granted.
		st := e.Srv.WorkerStatus(id)
		if !slices.Contains(st.Projects, e.Project.ID) || !slices.Contains(st.Projects, e.Bare.ID) {
			t.Errorf("projects after reauth %v", st.Projects)
		}
		list, err := e.Srv.ProjectWorkers(ctx, e.Bare.ID)
		if err != nil || len(list) != 1 || !list[0].Live {
			t.Errorf("bare project's workers %+v %v", list, err)
		}
		e.AssertNoSecretLogged()
	})
}

// Reauths in quick succession (peers registering through the admin path
// while the worker's peers file changes) overlap an outstanding
// challenge: the session survives every one and ends with all peers.
func TestReauthOverlappingTriggers(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		tokens := map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)}
		w := e.MustConnect(id, maps.Clone(tokens))

		// Three registrations, each reauthing the live session before the
		// worker answered anything.
		second, err := db.CreateCache(ctx, storage.NewCache{Name: "second"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, e.Bare.ID, e.Cache.ID); err != nil {
			t.Fatal(err)
		}
		for _, peer := range []struct {
			kind storage.PeerKind
			id   string
		}{{storage.PeerCache, e.Cache.ID}, {storage.PeerCache, second.ID}, {storage.PeerProject, e.Bare.ID}} {
			tokens[peer.id] = e.Register(peer.kind, peer.id, id)
			if !e.Srv.Reauth(id) {
				t.Fatal("no live session to reauth")
			}
		}
		// The worker's peers file now holds every token: ReauthRequest.
		if err := w.Auth.RequestReauth(w.Sess, tokens); err != nil {
			t.Fatal(err)
		}

		want := []string{e.Project.ID, e.Cache.ID, second.ID, e.Bare.ID}
		slices.Sort(want)
		for done := false; !done; {
			switch m := w.Recv(t).(type) {
			case *wire.AuthChallenge:
				if err := w.Sess.Send(w.Auth.Answer(m)); err != nil {
					t.Fatal(err)
				}
			case *wire.AuthUpdate:
				got := slices.Sorted(slices.Values(m.AuthorizedPeers))
				done = slices.Equal(got, want)
			default:
				t.Fatalf("got %#v during reauth", m)
			}
		}
		// The session lives on, with both projects.
		if err := w.Sess.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := w.Recv(t).(*wire.JobListChunk); !ok {
			t.Fatal("the session did not survive the reauths")
		}
		st := e.Srv.WorkerStatus(id)
		if !st.Live || !slices.Contains(st.Projects, e.Project.ID) || !slices.Contains(st.Projects, e.Bare.ID) {
			t.Fatalf("after the reauths: %+v", st)
		}
		e.AssertNoSecretLogged()
	})
}

// Server Stop: Close ends every session at once and the worker sees it.
func TestCloseEndsSessions(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		w := e.MustConnect(id, map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)})
		e.Srv.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := w.Sess.Recv(ctx); err == nil {
			t.Fatal("the session survived the server stop")
		}
		if ctx.Err() != nil {
			t.Fatal("the worker did not notice the stop")
		}
	})
}

// A worker silent past the heartbeat timeout is dropped, and the reason is
// kept as its offline reason.
func TestHeartbeatTimeout(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{HeartbeatTimeout: 300 * time.Millisecond})
		id := storage.NewID()
		w := e.MustConnect(id, map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)})
		waitfor.True(t, "the silent worker to be dropped", func() bool { return !e.Srv.WorkerStatus(id).Live })
		if r := e.Srv.WorkerStatus(id).OfflineReason; !strings.Contains(r, "heartbeat") {
			t.Errorf("offline reason %q", r)
		}
		// The worker sees the close.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := w.Sess.Recv(ctx); err == nil || ctx.Err() != nil {
			t.Fatalf("worker after the drop: %v", err)
		}
	})
}

// Deactivating a live worker ends its session; its reconnect is refused.
func TestDeactivateEndsLiveSession(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		token := e.Register(storage.PeerProject, e.Project.ID, id)
		w := e.MustConnect(id, map[string]string{e.Project.ID: token})
		if err := e.Srv.DeactivateWorker(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := w.Sess.Recv(ctx); err == nil || ctx.Err() != nil {
			t.Fatalf("the session survived deactivation: %v", err)
		}
		waitfor.True(t, "the worker to go offline", func() bool { return !e.Srv.WorkerStatus(id).Live })
		if st := e.Srv.WorkerStatus(id); !strings.Contains(st.OfflineReason, "worker deactivated") {
			t.Errorf("status after deactivation %+v", st)
		}
		e.ExpectReject(id, map[string]string{e.Project.ID: token}, 403, "worker is deactivated")
	})
}

// drainSeen records, for each RequestJob the job loop gets, whether the
// session was draining by then.
type drainSeen struct{ seen chan bool }

func (d drainSeen) SessionStarted(*authority.LiveWorker)       {}
func (d drainSeen) SessionEnded(*authority.LiveWorker, string) {}
func (d drainSeen) HandleJobMessage(w *authority.LiveWorker, m wire.ClientMessage) {
	if _, ok := m.(*wire.RequestJob); ok {
		d.seen <- w.Draining()
	}
}

// A worker's Draining reaches the job loop before its next message, so
// no job is handed to a draining worker.
func TestWorkerDrainingReachesTheJobLoop(t *testing.T) {
	t.Parallel()
	loop := drainSeen{seen: make(chan bool, 4)}
	db, err := storage.Open(t.Context(), storagetest.SQLiteURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e := servertest.NewEnv(t, db, server.Config{Jobs: loop})
	id := storage.NewID()
	w := e.MustConnect(id, map[string]string{e.Project.ID: e.Register(storage.PeerProject, e.Project.ID, id)})
	w.Sess.Send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if <-loop.seen {
		t.Fatal("a fresh session counts as draining")
	}
	w.Sess.Send(&wire.ClientDraining{})
	w.Sess.Send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if !<-loop.seen {
		t.Fatal("the job loop saw a RequestJob after Draining from a session not marked draining")
	}
}
