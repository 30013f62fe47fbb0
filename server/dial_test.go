package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// dialConfig is a server that dials, with backoffs short enough for tests.
func dialConfig(t *testing.T) server.Config {
	t.Helper()
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	return server.Config{DialKey: box, DialBackoff: 40 * time.Millisecond, DialMaxBackoff: 160 * time.Millisecond, DialRescan: time.Minute}
}

// dialedWorker is a worker in server-dialed mode built from the session
// layer, listening on loopback. It checks the server's tokens against
// hashes, as a worker's accepted-server-tokens file does.
type dialedWorker struct {
	t   *testing.T
	id  string
	url string

	mu        sync.Mutex
	accepted  map[string]string // peer → hash: the accepted-server-tokens file
	presented [][]wire.Pair[string, string]
	attempts  []time.Time
	sessions  chan *session.WorkerSession
	down      atomic.Bool // answer the upgrade with 503, as a worker that is not up
}

func newDialedWorker(t *testing.T) *dialedWorker {
	w := &dialedWorker{t: t, id: storage.NewID(), accepted: map[string]string{}, sessions: make(chan *session.WorkerSession, 8)}
	serve := session.Handler(func(r *http.Request, tr session.Transport) {
		discard := slog.New(slog.DiscardHandler)
		c := session.NewConn(tr, session.ConnOptions{Logger: discard})
		est, err := session.RunDialed(r.Context(), c, session.DialedConfig{WorkerID: w.id, Capabilities: servertest.WorkerCaps, Verifier: w})
		if err != nil {
			return
		}
		sess := session.SplitWorker(c, est, session.Options{Logger: discard})
		w.sessions <- sess
		select {
		case <-sess.Done():
		case <-r.Context().Done():
			sess.Close(session.CloseNormal, "worker stopping")
		}
	})
	hs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		w.attempts = append(w.attempts, time.Now())
		w.mu.Unlock()
		if w.down.Load() {
			http.Error(rw, "starting", http.StatusServiceUnavailable)
			return
		}
		serve.ServeHTTP(rw, r)
	}))
	t.Cleanup(hs.Close)
	w.url = "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
	return w
}

// accept adds token to the accepted-server-tokens file, checking the line
// the admin hands out. The file keeps the token's hex SHA-256 (a format the
// file allows too): argon2id on every dial is slow under the race detector.
func (w *dialedWorker) accept(peerID, token string) {
	w.t.Helper()
	line, err := admin.AcceptedServerTokenLine(peerID, token)
	if err != nil {
		w.t.Fatal(err)
	}
	peer, hash, _ := strings.Cut(line, ":")
	if peer != peerID || !strings.HasPrefix(hash, "$argon2id$") || !secret.Verify(hash, token) {
		w.t.Fatalf("accepted-server-tokens line %q does not accept the token", line)
	}
	sum := sha256.Sum256([]byte(token))
	w.mu.Lock()
	w.accepted[peer] = hex.EncodeToString(sum[:])
	w.mu.Unlock()
}

// VerifyServer accepts the server when every token it presented matches
// the accepted hash of its peer.
func (w *dialedWorker) VerifyServer(workerID string, tokens []wire.Pair[string, string]) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.presented = append(w.presented, slices.Clone(tokens))
	for _, p := range tokens {
		hash, ok := w.accepted[p.First]
		if !ok || !secret.Verify(hash, p.Second) {
			return false
		}
	}
	return workerID == w.id && len(tokens) > 0
}

func (w *dialedWorker) attemptCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.attempts)
}

func (w *dialedWorker) lastPresented() []wire.Pair[string, string] {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.presented) == 0 {
		return nil
	}
	return w.presented[len(w.presented)-1]
}

// session waits for the next established session.
func (w *dialedWorker) session() *session.WorkerSession {
	w.t.Helper()
	select {
	case s := <-w.sessions:
		w.t.Cleanup(func() { s.Close(session.CloseNormal, "test over") })
		return s
	case <-time.After(10 * time.Second):
		w.t.Fatalf("worker %s: the server did not dial it (attempts %d)", w.id, w.attemptCount())
		return nil
	}
}

// registerDialed registers the worker at its URL for a peer through the
// server and puts the token into the worker's accepted file. The worker
// answers 503 meanwhile, so no dial sees the token before the file does.
func registerDialed(e *servertest.Env, w *dialedWorker, kind storage.PeerKind, peerID string) string {
	e.T.Helper()
	w.down.Store(true)
	defer w.down.Store(false)
	token := createDialed(e, w, kind, peerID)
	w.accept(peerID, token)
	return token
}

// createDialed registers the worker at its URL, leaving its accepted file
// alone.
func createDialed(e *servertest.Env, w *dialedWorker, kind storage.PeerKind, peerID string) string {
	e.T.Helper()
	settings := storage.DefaultWorkerSettings()
	settings.URL = w.url
	_, token, err := e.Srv.CreateRegistration(e.T.Context(), storage.Peer{Kind: kind, ID: peerID}, w.id, settings)
	if err != nil {
		e.T.Fatal(err)
	}
	e.Remember(token)
	return token
}

func pair(peer, token string) wire.Pair[string, string] {
	return wire.Pair[string, string]{First: peer, Second: token}
}

func sortedPairs(p []wire.Pair[string, string]) []wire.Pair[string, string] {
	p = slices.Clone(p)
	slices.SortFunc(p, func(a, b wire.Pair[string, string]) int { return strings.Compare(a.First, b.First) })
	return p
}

// recvWorker reads the next server message on a dialed worker's session.
func recvWorker(t *testing.T, s *session.WorkerSession) wire.ServerMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	m, err := s.Recv(ctx)
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return m
}

// expectClosed requires the server to end the session.
func expectClosed(t *testing.T, s *session.WorkerSession) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if m, err := s.Recv(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("the session stayed up (got %v, %v)", m, err)
	}
}

func TestDialedWorkerConnects(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, dialConfig(t))
		w := newDialedWorker(t)
		projectToken := registerDialed(e, w, storage.PeerProject, e.Project.ID)
		cacheToken := registerDialed(e, w, storage.PeerCache, e.Cache.ID)
		bareToken := registerDialed(e, w, storage.PeerProject, e.Bare.ID)
		// A registration without a URL (a proxy's, for the worker dialing
		// it) is never presented on the server's dial.
		e.Register(storage.PeerProxy, storage.NewID(), w.id)
		sess := w.session()

		want := sortedPairs([]wire.Pair[string, string]{pair(e.Project.ID, projectToken), pair(e.Cache.ID, cacheToken), pair(e.Bare.ID, bareToken)})
		if got := sortedPairs(w.lastPresented()); !slices.Equal(got, want) {
			t.Fatalf("the server presented %d tokens %v, want one per registration at the URL", len(got), got)
		}
		authorized := slices.Sorted(slices.Values(sess.AuthorizedPeers))
		if want := slices.Sorted(slices.Values([]string{e.Project.ID, e.Cache.ID})); !slices.Equal(authorized, want) {
			t.Fatalf("InitAck authorized %v, want %v", sess.AuthorizedPeers, want)
		}
		if len(sess.FailedPeers) != 1 || sess.FailedPeers[0].PeerID != e.Bare.ID || sess.FailedPeers[0].Reason != "project has no cache subscribed" {
			t.Fatalf("InitAck failed %+v, want the project without a cache", sess.FailedPeers)
		}
		if c := sess.Capabilities; !c.Core || !c.Cache || !c.Build {
			t.Fatalf("negotiated %+v", c)
		}
		st := e.Srv.WorkerStatus(w.id)
		if !st.Live || st.DialedURL != w.url || !slices.Equal(st.Projects, []string{e.Project.ID}) {
			t.Fatalf("status %+v", st)
		}
		// The dispatch loop is the one of worker-dialed sessions.
		if err := sess.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		if page, ok := recvWorker(t, sess).(*wire.JobListChunk); !ok || !page.IsFinal {
			t.Fatalf("got %#v", page)
		}
		if !strings.Contains(e.Logs.String(), "dialing without TLS") {
			t.Fatal("no warning for a ws:// URL")
		}
		e.AssertNoSecretLogged()
	})
}

func TestDialedWorkerRejectsServer(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, dialConfig(t))
		w := newDialedWorker(t)
		w.accept(e.Project.ID, "a token of another server")
		createDialed(e, w, storage.PeerProject, e.Project.ID)

		waitfor.True(t, "three dials", func() bool { return w.attemptCount() >= 3 })
		want := "worker rejected connection (code 401): unknown worker id or wrong token"
		waitfor.True(t, "the offline reason", func() bool { return e.Srv.WorkerStatus(w.id).OfflineReason == want })
		if st := e.Srv.WorkerStatus(w.id); st.Live {
			t.Fatalf("status %+v", st)
		}

		// A deleted registration is no longer dialed.
		if err := db.DeleteRegistration(t.Context(), storage.Peer{Kind: storage.PeerProject, ID: e.Project.ID}, w.id); err != nil {
			t.Fatal(err)
		}
		e.Srv.RefreshDials()
		// Its redial loop ends (a dial under way is cancelled first).
		waitfor.True(t, "the redial loop to stop", func() bool { return e.Srv.DialsRunning() == 0 })
		n := w.attemptCount()
		time.Sleep(500 * time.Millisecond)
		if w.attemptCount() != n {
			t.Fatalf("still dialing a deleted registration: %d attempts, then %d", n, w.attemptCount())
		}
		e.AssertNoSecretLogged()
	})
}

func TestDialedWorkerDownIsRedialedWithBackoff(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, dialConfig(t))
		w := newDialedWorker(t)
		w.down.Store(true)
		w.accept(e.Project.ID, createDialed(e, w, storage.PeerProject, e.Project.ID))

		waitfor.True(t, "five dials", func() bool { return w.attemptCount() >= 5 })
		w.mu.Lock()
		gaps := make([]time.Duration, 0, 4)
		for i := 1; i < 5; i++ {
			gaps = append(gaps, w.attempts[i].Sub(w.attempts[i-1]))
		}
		w.mu.Unlock()
		// 40 ms doubling to 160 ms: the later gaps reach the cap.
		if gaps[0] < 30*time.Millisecond || gaps[3] < 120*time.Millisecond {
			t.Fatalf("redial gaps %v: want 40 ms doubling to 160 ms", gaps)
		}
		if r := e.Srv.WorkerStatus(w.id).OfflineReason; !strings.Contains(r, "HTTP 503") {
			t.Fatalf("offline reason %q: want the dial failure", r)
		}

		w.down.Store(false)
		sess := w.session()
		if !slices.Equal(sess.AuthorizedPeers, []string{e.Project.ID}) {
			t.Fatalf("InitAck authorized %v", sess.AuthorizedPeers)
		}
	})
}

func TestDialedReauth(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := servertest.NewEnv(t, db, dialConfig(t))
		w := newDialedWorker(t)
		projectToken := registerDialed(e, w, storage.PeerProject, e.Project.ID)
		sess := w.session()

		// Nothing new: AuthUpdate directly, never AuthChallenge, and the
		// session stays.
		if err := sess.Send(&wire.ReauthRequest{}); err != nil {
			t.Fatal(err)
		}
		if u, ok := recvWorker(t, sess).(*wire.AuthUpdate); !ok || !slices.Equal(u.AuthorizedPeers, []string{e.Project.ID}) {
			t.Fatalf("reauth answered %#v, want AuthUpdate", u)
		}
		if err := sess.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := recvWorker(t, sess).(*wire.JobListChunk); !ok {
			t.Fatal("the session did not survive a reauth without news")
		}

		// A new registration at the URL: the reauth closes the session and
		// the next dial carries both tokens.
		other, err := db.CreateProject(ctx, storage.NewProject{TeamID: e.Team.ID, Name: "api", Repository: "https://example.invalid/api.git", Branch: "main"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, other.ID, e.Cache.ID); err != nil {
			t.Fatal(err)
		}
		otherToken := registerDialed(e, w, storage.PeerProject, other.ID)
		if err := sess.Send(&wire.ReauthRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := recvWorker(t, sess).(*wire.AuthUpdate); !ok {
			t.Fatal("no AuthUpdate")
		}
		expectClosed(t, sess)
		next := w.session()
		want := sortedPairs([]wire.Pair[string, string]{pair(e.Project.ID, projectToken), pair(other.ID, otherToken)})
		if got := sortedPairs(w.lastPresented()); !slices.Equal(got, want) {
			t.Fatalf("the redial presented %v, want both tokens", got)
		}
		if len(next.AuthorizedPeers) != 2 {
			t.Fatalf("InitAck authorized %v", next.AuthorizedPeers)
		}

		// The server's own reauth (the admin API's, after a registration)
		// takes the same path.
		third, err := db.CreateCache(ctx, storage.NewCache{Name: "third"})
		if err != nil {
			t.Fatal(err)
		}
		registerDialed(e, w, storage.PeerCache, third.ID)
		if !e.Srv.Reauth(w.id) {
			t.Fatal("Server.Reauth did not reach the dialed session")
		}
		if _, ok := recvWorker(t, next).(*wire.AuthUpdate); !ok {
			t.Fatal("no AuthUpdate")
		}
		expectClosed(t, next)
		if got := w.session(); len(got.AuthorizedPeers) != 3 {
			t.Fatalf("InitAck authorized %v", got.AuthorizedPeers)
		}
		e.AssertNoSecretLogged()
	})
}

// A reauth that grants more through the tokens the dial presented (a
// registered project subscribing a cache) keeps the dialed session; only
// a new registration at its URL closes it, for a dial that carries it.
func TestDialedReauthClosesOnlyForANewRegistration(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := servertest.NewEnv(t, db, dialConfig(t))
		w := newDialedWorker(t)
		// Both registrations before the first dial: it presents both
		// tokens; the bare project fails for want of a cache.
		w.down.Store(true)
		projectToken := createDialed(e, w, storage.PeerProject, e.Project.ID)
		bareToken := createDialed(e, w, storage.PeerProject, e.Bare.ID)
		w.accept(e.Project.ID, projectToken)
		w.accept(e.Bare.ID, bareToken)
		w.down.Store(false)
		sess := w.session()
		if !slices.Equal(sess.AuthorizedPeers, []string{e.Project.ID}) || len(sess.FailedPeers) != 1 {
			t.Fatalf("InitAck authorized %v failed %v", sess.AuthorizedPeers, sess.FailedPeers)
		}

		// The bare project subscribes a cache (the admin's reauth of its
		// workers): AuthUpdate, and the session stays.
		if _, err := db.SubscribeProject(ctx, e.Bare.ID, e.Cache.ID); err != nil {
			t.Fatal(err)
		}
		if n, err := e.Srv.ReauthProject(ctx, e.Bare.ID); err != nil || n != 1 {
			t.Fatalf("reauthorized %d sessions: %v", n, err)
		}
		u, ok := recvWorker(t, sess).(*wire.AuthUpdate)
		if !ok || !slices.Contains(u.AuthorizedPeers, e.Bare.ID) || len(u.FailedPeers) != 0 {
			t.Fatalf("reauth answered %#v, want AuthUpdate with the bare project", u)
		}
		if err := sess.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := recvWorker(t, sess).(*wire.JobListChunk); !ok {
			t.Fatal("the session did not survive a reauth through presented tokens")
		}
		if st := e.Srv.WorkerStatus(w.id); !st.Live || !slices.Contains(st.Projects, e.Bare.ID) {
			t.Fatalf("after the subscription: %+v", st)
		}

		// A cache registers the worker at its URL: AuthUpdate without the
		// unproven cache, then the session closes and the redial presents
		// all three tokens.
		cacheToken := registerDialed(e, w, storage.PeerCache, e.Cache.ID)
		if !e.Srv.Reauth(w.id) {
			t.Fatal("Server.Reauth did not reach the dialed session")
		}
		if u, ok := recvWorker(t, sess).(*wire.AuthUpdate); !ok || slices.Contains(u.AuthorizedPeers, e.Cache.ID) {
			t.Fatalf("reauth answered %#v, want AuthUpdate without the new registration", u)
		}
		expectClosed(t, sess)
		next := w.session()
		want := sortedPairs([]wire.Pair[string, string]{pair(e.Project.ID, projectToken), pair(e.Bare.ID, bareToken), pair(e.Cache.ID, cacheToken)})
		if got := sortedPairs(w.lastPresented()); !slices.Equal(got, want) {
			t.Fatalf("the redial presented %v, want all three tokens", got)
		}
		if len(next.AuthorizedPeers) != 3 {
			t.Fatalf("InitAck authorized %v", next.AuthorizedPeers)
		}
		e.AssertNoSecretLogged()
	})
}

func TestDialedTeamWorker(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := servertest.NewEnv(t, db, dialConfig(t))
		builders, err := db.CreateTeam(ctx, "builders")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.GrantTeam(ctx, e.Project.ID, builders.ID); err != nil {
			t.Fatal(err)
		}
		w := newDialedWorker(t)
		settings := storage.DefaultWorkerSettings()
		settings.URL = w.url
		w.down.Store(true)
		_, token, err := e.Srv.CreateTeamWorker(ctx, builders.ID, w.id, settings)
		if err != nil {
			t.Fatal(err)
		}
		e.Remember(token)
		w.accept(builders.ID, token)
		w.down.Store(false)

		// A registration may not reuse the team worker's ID.
		if _, _, err := e.Srv.CreateRegistration(ctx, storage.Peer{Kind: storage.PeerProject, ID: e.Project.ID}, w.id, settings); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("registration of a team worker's ID: err = %v, want ErrConflict", err)
		}

		sess := w.session()
		dials := w.attemptCount()
		if got := w.lastPresented(); !slices.Equal(got, []wire.Pair[string, string]{pair(builders.ID, token)}) {
			t.Fatalf("presented %d tokens, want the team's one", len(got))
		}
		if !slices.Equal(sess.AuthorizedPeers, []string{builders.ID}) {
			t.Fatalf("InitAck authorized %v", sess.AuthorizedPeers)
		}
		if st := e.Srv.WorkerStatus(w.id); !slices.Equal(st.Projects, []string{e.Project.ID}) {
			t.Fatalf("status %+v", st)
		}

		// Another project grants the team: it joins the running session.
		other, err := db.CreateProject(ctx, storage.NewProject{TeamID: e.Team.ID, Name: "api", Repository: "https://example.invalid/api.git", Branch: "main"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, other.ID, e.Cache.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.GrantTeam(ctx, other.ID, builders.ID); err != nil {
			t.Fatal(err)
		}
		if n, err := e.Srv.ReauthTeam(ctx, builders.ID); err != nil || n != 1 {
			t.Fatalf("ReauthTeam = %d, %v", n, err)
		}
		if u, ok := recvWorker(t, sess).(*wire.AuthUpdate); !ok || !slices.Equal(u.AuthorizedPeers, []string{builders.ID}) {
			t.Fatalf("got %#v, want AuthUpdate", u)
		}
		st := e.Srv.WorkerStatus(w.id)
		if !slices.Equal(slices.Sorted(slices.Values(st.Projects)), slices.Sorted(slices.Values([]string{e.Project.ID, other.ID}))) {
			t.Fatalf("status %+v: want both granting projects", st)
		}
		if err := sess.Send(&wire.RequestJobList{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := recvWorker(t, sess).(*wire.JobListChunk); !ok {
			t.Fatal("the session did not stay up")
		}
		if w.attemptCount() != dials {
			t.Fatalf("%d dials after the session was up: want it kept", w.attemptCount()-dials)
		}
		e.AssertNoSecretLogged()
	})
}

func TestDialedWorkerNeedsDialKey(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{})
		settings := storage.DefaultWorkerSettings()
		settings.URL = "wss://worker.invalid/proto"
		_, _, err := e.Srv.CreateRegistration(t.Context(), storage.Peer{Kind: storage.PeerProject, ID: e.Project.ID}, storage.NewID(), settings)
		if !errors.Is(err, server.ErrNoDialKey) || !errors.Is(err, storage.ErrInvalid) ||
			err.Error() != "server-dialed workers need a dial key: set --dial-key-file" {
			t.Fatalf("err = %v", err)
		}
		if _, _, err := e.Srv.CreateTeamWorker(t.Context(), e.Team.ID, storage.NewID(), settings); !errors.Is(err, server.ErrNoDialKey) {
			t.Fatalf("team worker: err = %v", err)
		}
		// Workers that dial in need no key.
		if _, _, err := e.Srv.CreateRegistration(t.Context(), storage.Peer{Kind: storage.PeerProject, ID: e.Project.ID}, storage.NewID(), storage.DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDialTokenFollowsTheCredential(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		ctx := t.Context()
		e := servertest.NewEnv(t, db, dialConfig(t))
		peer := storage.Peer{Kind: storage.PeerProject, ID: e.Project.ID}
		worker := storage.NewID()
		sealedOpensTo := func(want string) bool {
			reg, err := db.Registration(ctx, peer, worker)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := e.Srv.OpenDialToken(reg.DialTokenSealed, reg.Peer, reg.WorkerID)
			return ok && got == want
		}
		if _, _, err := e.Srv.CreateRegistration(ctx, peer, worker, storage.DefaultWorkerSettings()); err != nil {
			t.Fatal(err)
		}
		// Setting a URL: only the worker knows the old token, so a new one.
		dialed := storage.DefaultWorkerSettings()
		dialed.URL = "ws://127.0.0.1:1/proto"
		token, err := e.Srv.UpdateRegistration(ctx, peer, worker, dialed)
		if err != nil || token == "" || !sealedOpensTo(token) {
			t.Fatalf("UpdateRegistration = %q, %v: want a new, sealed token", token, err)
		}
		if again, err := e.Srv.UpdateRegistration(ctx, peer, worker, dialed); err != nil || again != "" {
			t.Fatalf("a second update rotated again: %q, %v", again, err)
		}
		rotated, err := e.Srv.RotateRegistrationToken(ctx, peer, worker)
		if err != nil || !sealedOpensTo(rotated) {
			t.Fatalf("RotateRegistrationToken = %v: want the new token sealed", err)
		}
		// The sealed value is bound to its registration.
		other := storage.Peer{Kind: storage.PeerCache, ID: e.Cache.ID}
		reg, _ := db.Registration(ctx, peer, worker)
		if _, ok := e.Srv.OpenDialToken(reg.DialTokenSealed, other, worker); ok {
			t.Fatal("a sealed token opened for another registration")
		}
		e.Remember(token)
		e.Remember(rotated)
		e.AssertNoSecretLogged()
	})
}
