package server

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }

// testEnv is a real server on loopback over a real database, with one team,
// one project subscribed to one cache, and a second project without a cache.
type testEnv struct {
	t        testing.TB
	db       *storage.DB
	srv      *Server
	url      string
	logs     *testlog.Buffer
	team     storage.Team
	project  storage.Project
	bare     storage.Project // no cache subscription
	cache    storage.Cache
	tokensMu sync.Mutex
	tokens   []string // every token handed out, to search the logs for
}

func newEnv(t testing.TB, db *storage.DB, cfg Config) *testEnv {
	t.Helper()
	ctx := t.Context()
	logs := &testlog.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.HandshakeTimeout == 0 {
		// Long enough for a 496 that first probes the holder (up to 7 s)
		// on a loaded machine; passing tests never wait for it.
		cfg.HandshakeTimeout = 15 * time.Second
	}
	srv := New(db, cfg)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	e := &testEnv{t: t, db: db, srv: srv, url: "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto", logs: logs}
	var err error
	if e.team, err = db.CreateTeam(ctx, "ops"); err != nil {
		t.Fatal(err)
	}
	if e.project, err = db.CreateProject(ctx, storage.NewProject{TeamID: e.team.ID, Name: "web", Repository: "https://example.invalid/web.git", Branch: "main"}); err != nil {
		t.Fatal(err)
	}
	if e.bare, err = db.CreateProject(ctx, storage.NewProject{TeamID: e.team.ID, Name: "bare", Repository: "https://example.invalid/bare.git", Branch: "main"}); err != nil {
		t.Fatal(err)
	}
	if e.cache, err = db.CreateCache(ctx, storage.NewCache{Name: "main"}); err != nil {
		t.Fatal(err)
	}
	if _, err = db.SubscribeProject(ctx, e.project.ID, e.cache.ID); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *testEnv) register(kind storage.PeerKind, peerID, workerID string) string {
	e.t.Helper()
	_, token, err := e.db.CreateRegistration(e.t.Context(), storage.Peer{Kind: kind, ID: peerID}, workerID, storage.DefaultWorkerSettings())
	if err != nil {
		e.t.Fatal(err)
	}
	e.remember(token)
	return token
}

func (e *testEnv) remember(token string) {
	e.tokensMu.Lock()
	e.tokens = append(e.tokens, token)
	e.tokensMu.Unlock()
}

// testWorker is a worker built from the session layer, dialing the server.
type testWorker struct {
	id     string
	est    *session.Established
	sess   *session.WorkerSession
	auth   *session.WorkerAuth
	tokens map[string]string
}

var workerCaps = wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}

func (e *testEnv) connect(workerID string, tokens map[string]string) (*testWorker, error) {
	ctx, cancel := context.WithTimeout(e.t.Context(), 10*time.Second)
	defer cancel()
	tr, err := session.Dial(ctx, e.url, session.DialOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: slog.New(slog.DiscardHandler)})
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: workerID, Capabilities: workerCaps, Tokens: tokens})
	if err != nil {
		tr.Close(session.CloseNormal, "")
		return nil, err
	}
	w := &testWorker{id: workerID, est: est, tokens: tokens}
	w.sess = session.SplitWorker(c, est, session.Options{Logger: slog.New(slog.DiscardHandler)})
	w.auth = session.NewWorkerAuth(est, tokens)
	e.t.Cleanup(func() { w.sess.Close(session.CloseNormal, "test over") })
	return w, nil
}

func (e *testEnv) mustConnect(workerID string, tokens map[string]string) *testWorker {
	e.t.Helper()
	w, err := e.connect(workerID, tokens)
	if err != nil {
		e.t.Fatalf("worker %s: %v", workerID, err)
	}
	return w
}

// expectReject connects and requires a Reject with code and reason.
func (e *testEnv) expectReject(workerID string, tokens map[string]string, code uint16, reason string) {
	e.t.Helper()
	_, err := e.connect(workerID, tokens)
	var he *handshake.Error
	if !errors.As(err, &he) || !he.Remote || he.Code != code || he.Reason != reason {
		e.t.Fatalf("worker %s: got %v, want Reject %d %q", workerID, err, code, reason)
	}
}

// recv reads the next message that is not an auth message handled by the
// worker's auth state.
func (w *testWorker) recv(t *testing.T) wire.ServerMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	m, err := w.sess.Recv(ctx)
	if err != nil {
		t.Fatalf("worker %s: recv: %v", w.id, err)
	}
	return m
}

func newWorkerID(t testing.TB) string {
	t.Helper()
	return storage.NewID()
}

func TestWorkerConnects(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newEnv(t, db, Config{})
		id := newWorkerID(t)
		token := e.register(storage.PeerProject, e.project.ID, id)
		w := e.mustConnect(id, map[string]string{e.project.ID: token})

		if !slices.Equal(w.est.AuthorizedPeers, []string{e.project.ID}) || len(w.est.FailedPeers) != 0 {
			t.Fatalf("InitAck authorized %v failed %v", w.est.AuthorizedPeers, w.est.FailedPeers)
		}
		caps := w.est.Capabilities
		if !caps.Core || !caps.Cache || !caps.Build || !caps.Eval || !caps.Fetch || caps.Federate {
			t.Errorf("negotiated %+v", caps)
		}
		st := e.srv.WorkerStatus(id)
		if !st.Live || !slices.Equal(st.Projects, []string{e.project.ID}) {
			t.Errorf("status %+v", st)
		}
		// Live only for the project it authenticated for.
		list, err := e.srv.ProjectWorkers(t.Context(), e.project.ID)
		if err != nil || len(list) != 1 || !list[0].Live {
			t.Fatalf("project workers %+v %v", list, err)
		}
		// An empty job list is one final page.
		if err := w.sess.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		if page, ok := w.recv(t).(*wire.JobListChunk); !ok || !page.IsFinal {
			t.Fatalf("got %#v", page)
		}
	})
}

func TestRejections(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := newEnv(t, db, Config{})

		unknown := newWorkerID(t)
		e.expectReject(unknown, nil, 403, "unknown worker")
		if e.srv.auth.ForTest().HasOfflineReason(unknown) {
			t.Error("a failure of an unregistered worker ID was kept")
		}

		wrong := newWorkerID(t)
		e.register(storage.PeerProject, e.project.ID, wrong)
		e.expectReject(wrong, map[string]string{e.project.ID: "not-the-token"}, 401, "no valid peer tokens provided")
		// The server keeps the reason right after sending the Reject.
		waitfor.True(t, "the offline reason", func() bool {
			return strings.Contains(e.srv.WorkerStatus(wrong).OfflineReason, "no valid peer tokens provided")
		})

		noCache := newWorkerID(t)
		tok := e.register(storage.PeerProject, e.bare.ID, noCache)
		e.expectReject(noCache, map[string]string{e.bare.ID: tok}, 495, "project has no cache subscribed")

		off := newWorkerID(t)
		tok = e.register(storage.PeerProject, e.project.ID, off)
		if err := db.DeactivateWorker(ctx, off); err != nil {
			t.Fatal(err)
		}
		e.expectReject(off, map[string]string{e.project.ID: tok}, 403, "worker is deactivated")

		teamWorker := newWorkerID(t)
		other, err := db.CreateTeam(ctx, "nobody-grants")
		if err != nil {
			t.Fatal(err)
		}
		_, tok, err = db.CreateTeamWorker(ctx, other.ID, teamWorker, storage.DefaultWorkerSettings())
		if err != nil {
			t.Fatal(err)
		}
		e.remember(tok)
		e.expectReject(teamWorker, map[string]string{other.ID: tok}, 403, "no project grants this team's workers")

		dup := newWorkerID(t)
		tok = e.register(storage.PeerProject, e.project.ID, dup)
		holder := e.mustConnect(dup, map[string]string{e.project.ID: tok})
		// A live worker keeps reading its session, so it answers the
		// server's probe of the holder that a second connection triggers.
		go func() {
			for {
				if _, err := holder.sess.Recv(context.Background()); err != nil {
					return
				}
			}
		}()
		e.expectReject(dup, map[string]string{e.project.ID: tok}, 496, "worker already connected")
		if !e.srv.WorkerStatus(dup).Live {
			t.Error("the first session did not survive the second connection")
		}

		e.srv.SetAccepting(false)
		later := newWorkerID(t)
		tok = e.register(storage.PeerProject, e.project.ID, later)
		e.expectReject(later, map[string]string{e.project.ID: tok}, 403, "server is not accepting connections")
		e.srv.SetAccepting(true)
		e.mustConnect(later, map[string]string{e.project.ID: tok})

		e.assertNoTokenLogged()
	})
}

func TestPartialFailureKeepsSession(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newEnv(t, db, Config{})
		id := newWorkerID(t)
		good := e.register(storage.PeerProject, e.project.ID, id)
		e.register(storage.PeerProject, e.bare.ID, id)
		w := e.mustConnect(id, map[string]string{e.project.ID: good, e.bare.ID: "wrong"})
		if !slices.Equal(w.est.AuthorizedPeers, []string{e.project.ID}) ||
			!slices.Equal(w.est.FailedPeers, []wire.FailedPeer{{PeerID: e.bare.ID, Reason: "invalid token"}}) {
			t.Fatalf("authorized %v failed %v", w.est.AuthorizedPeers, w.est.FailedPeers)
		}
	})
}

// A peer registering a live worker challenges it again; the new peer joins
// without a reconnect, and nothing granted is revoked.
func TestReauth(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := newEnv(t, db, Config{})
		id := newWorkerID(t)
		first := e.register(storage.PeerProject, e.project.ID, id)
		w := e.mustConnect(id, map[string]string{e.project.ID: first})

		// Server-initiated: a cache registers the worker.
		cacheToken := e.register(storage.PeerCache, e.cache.ID, id)
		if !e.srv.Reauth(id) {
			t.Fatal("no live session to reauth")
		}
		ch, ok := w.recv(t).(*wire.AuthChallenge)
		if !ok || !slices.Contains(ch.Peers, e.cache.ID) || !slices.Contains(ch.Peers, e.project.ID) {
			t.Fatalf("challenge %#v", ch)
		}
		if n := e.srv.auth.ForTest().Reauths("server", "sent"); n != 1 {
			t.Errorf("server-initiated reauths counted %v, want 1", n)
		}
		w.tokens[e.cache.ID] = cacheToken
		if err := w.sess.Send(w.auth.Answer(ch)); err != nil {
			t.Fatal(err)
		}
		up, ok := w.recv(t).(*wire.AuthUpdate)
		if !ok || !slices.Contains(up.AuthorizedPeers, e.cache.ID) || !slices.Contains(up.AuthorizedPeers, e.project.ID) {
			t.Fatalf("update %#v", up)
		}

		// Worker-initiated: the bare project subscribes to a cache and
		// registers the worker; the worker's peers file changed.
		bareToken := e.register(storage.PeerProject, e.bare.ID, id)
		if _, err := db.SubscribeProject(ctx, e.bare.ID, e.cache.ID); err != nil {
			t.Fatal(err)
		}
		tokens := map[string]string{e.project.ID: "rotated-and-now-wrong", e.bare.ID: bareToken, e.cache.ID: cacheToken}
		if err := w.auth.RequestReauth(w.sess, tokens); err != nil {
			t.Fatal(err)
		}
		ch, ok = w.recv(t).(*wire.AuthChallenge)
		if !ok {
			t.Fatalf("got %#v", ch)
		}
		// Counted once the challenge is out, which may be after it arrives.
		waitfor.True(t, "the worker-initiated reauth counted", func() bool {
			return e.srv.auth.ForTest().Reauths("worker", "sent") == 1
		})
		w.sess.Send(w.auth.Answer(ch))
		up, ok = w.recv(t).(*wire.AuthUpdate)
		if !ok || !slices.Contains(up.AuthorizedPeers, e.bare.ID) {
			t.Fatalf("update %#v", up)
		}
		// The project whose token now fails stays granted.
		st := e.srv.WorkerStatus(id)
		if !slices.Contains(st.Projects, e.project.ID) || !slices.Contains(st.Projects, e.bare.ID) {
			t.Errorf("projects after reauth %v", st.Projects)
		}
		list, err := e.srv.ProjectWorkers(ctx, e.bare.ID)
		if err != nil || len(list) != 1 || !list[0].Live {
			t.Errorf("bare project's workers %+v %v", list, err)
		}
		e.assertNoTokenLogged()
	})
}

// Reauths in quick succession (peers registering through the admin path
// while the worker's peers file changes) overlap an outstanding
// challenge: the session survives every one and ends with all peers.
func TestReauthOverlappingTriggers(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := newEnv(t, db, Config{})
		id := newWorkerID(t)
		tokens := map[string]string{e.project.ID: e.register(storage.PeerProject, e.project.ID, id)}
		w := e.mustConnect(id, maps.Clone(tokens))

		// Three registrations, each reauthing the live session before the
		// worker answered anything.
		second, err := db.CreateCache(ctx, storage.NewCache{Name: "second"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, e.bare.ID, e.cache.ID); err != nil {
			t.Fatal(err)
		}
		for _, peer := range []struct {
			kind storage.PeerKind
			id   string
		}{{storage.PeerCache, e.cache.ID}, {storage.PeerCache, second.ID}, {storage.PeerProject, e.bare.ID}} {
			tokens[peer.id] = e.register(peer.kind, peer.id, id)
			if !e.srv.Reauth(id) {
				t.Fatal("no live session to reauth")
			}
		}
		// The worker's peers file now holds every token: ReauthRequest.
		if err := w.auth.RequestReauth(w.sess, tokens); err != nil {
			t.Fatal(err)
		}

		want := []string{e.project.ID, e.cache.ID, second.ID, e.bare.ID}
		slices.Sort(want)
		for done := false; !done; {
			switch m := w.recv(t).(type) {
			case *wire.AuthChallenge:
				if err := w.sess.Send(w.auth.Answer(m)); err != nil {
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
		if err := w.sess.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := w.recv(t).(*wire.JobListChunk); !ok {
			t.Fatal("the session did not survive the reauths")
		}
		st := e.srv.WorkerStatus(id)
		if !st.Live || !slices.Contains(st.Projects, e.project.ID) || !slices.Contains(st.Projects, e.bare.ID) {
			t.Fatalf("after the reauths: %+v", st)
		}
		e.assertNoTokenLogged()
	})
}

// Server Stop: Close ends every session at once and the worker sees it.
func TestCloseEndsSessions(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newEnv(t, db, Config{})
		id := newWorkerID(t)
		w := e.mustConnect(id, map[string]string{e.project.ID: e.register(storage.PeerProject, e.project.ID, id)})
		e.srv.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := w.sess.Recv(ctx); err == nil {
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
		e := newEnv(t, db, Config{HeartbeatTimeout: 300 * time.Millisecond})
		id := newWorkerID(t)
		w := e.mustConnect(id, map[string]string{e.project.ID: e.register(storage.PeerProject, e.project.ID, id)})
		waitfor.True(t, "the silent worker to be dropped", func() bool { return !e.srv.WorkerStatus(id).Live })
		if r := e.srv.WorkerStatus(id).OfflineReason; !strings.Contains(r, "heartbeat") {
			t.Errorf("offline reason %q", r)
		}
		// The worker sees the close.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := w.sess.Recv(ctx); err == nil || ctx.Err() != nil {
			t.Fatalf("worker after the drop: %v", err)
		}
	})
}

func (e *testEnv) assertNoTokenLogged() {
	e.t.Helper()
	logs := e.logs.String()
	e.tokensMu.Lock()
	defer e.tokensMu.Unlock()
	for _, tok := range e.tokens {
		if strings.Contains(logs, tok) {
			e.t.Fatalf("a token appears in the server log")
		}
	}
}

// Deactivating a live worker ends its session; its reconnect is refused.
func TestDeactivateEndsLiveSession(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newEnv(t, db, Config{})
		id := newWorkerID(t)
		token := e.register(storage.PeerProject, e.project.ID, id)
		w := e.mustConnect(id, map[string]string{e.project.ID: token})
		if err := e.srv.DeactivateWorker(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if _, err := w.sess.Recv(ctx); err == nil || ctx.Err() != nil {
			t.Fatalf("the session survived deactivation: %v", err)
		}
		waitfor.True(t, "the worker to go offline", func() bool { return !e.srv.WorkerStatus(id).Live })
		if st := e.srv.WorkerStatus(id); !strings.Contains(st.OfflineReason, "worker deactivated") {
			t.Errorf("status after deactivation %+v", st)
		}
		e.expectReject(id, map[string]string{e.project.ID: token}, 403, "worker is deactivated")
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
	e := newEnv(t, db, Config{Jobs: loop})
	id := newWorkerID(t)
	w := e.mustConnect(id, map[string]string{e.project.ID: e.register(storage.PeerProject, e.project.ID, id)})
	w.sess.Send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if <-loop.seen {
		t.Fatal("a fresh session counts as draining")
	}
	w.sess.Send(&wire.ClientDraining{})
	w.sess.Send(&wire.RequestJob{Kind: wire.JobKindBuild})
	if !<-loop.seen {
		t.Fatal("the job loop saw a RequestJob after Draining from a session not marked draining")
	}
}
