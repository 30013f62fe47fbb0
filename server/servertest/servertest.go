// Package servertest runs a real server on loopback for the server's own
// tests and those of its parts beside them (server/cache, server/admin): a
// database with one team, one project subscribed to one cache and a second
// project without a cache, workers built from the session layer that dial
// it, and the admin API on an empty database with a client of it.
package servertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// AdminToken is the admin token tests present; SHA256Hex(AdminToken) is
// the server.Config.AdminTokenHash that accepts it without the argon2id
// cost.
const AdminToken = "admin-token-for-tests-0123456789"

// SHA256Hex is s's SHA-256 in hex, an admin token hash secret.Verify accepts.
func SHA256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// Env is a real server on loopback over a real database, with one team,
// one project subscribed to one cache, and a second project without a cache.
type Env struct {
	T       testing.TB
	DB      *storage.DB
	Srv     *server.Server
	URL     string // the ws:// /proto URL
	Logs    *testlog.Buffer
	Team    storage.Team
	Project storage.Project
	Bare    storage.Project // no cache subscription
	Cache   storage.Cache
	Secrets // tokens handed out (Register remembers its own)
}

// start runs a server on db with cfg (its logger replaced by Logs) until
// the test ends: an Env without a team, projects or cache.
func start(t testing.TB, db *storage.DB, cfg server.Config) *Env {
	logs := &testlog.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.HandshakeTimeout == 0 {
		// Long enough for a 496 that first probes the holder (up to 7 s)
		// on a loaded machine; passing tests never wait for it.
		cfg.HandshakeTimeout = 15 * time.Second
	}
	srv := server.New(db, cfg)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		srv.Close()
		hs.Close()
		if t.Failed() {
			t.Logf("server %s log:\n%s", srv.InstanceID(), logs.String())
		}
	})
	return &Env{T: t, DB: db, Srv: srv, URL: "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto", Logs: logs}
}

// Sibling starts another server instance on db (the same database as e's,
// through its own pool) with cfg, sharing e's team, projects and cache.
func (e *Env) Sibling(db *storage.DB, cfg server.Config) *Env {
	s := start(e.T, db, cfg)
	s.Team, s.Project, s.Bare, s.Cache = e.Team, e.Project, e.Bare, e.Cache
	return s
}

// NewEnv starts a server with cfg (its logger replaced by Logs) until the
// test ends.
func NewEnv(t testing.TB, db *storage.DB, cfg server.Config) *Env {
	t.Helper()
	ctx := t.Context()
	e := start(t, db, cfg)
	var err error
	if e.Team, err = db.CreateTeam(ctx, "ops"); err != nil {
		t.Fatal(err)
	}
	if e.Project, err = db.CreateProject(ctx, storage.NewProject{TeamID: e.Team.ID, Name: "web", Repository: "https://example.invalid/web.git", Branch: "main"}); err != nil {
		t.Fatal(err)
	}
	if e.Bare, err = db.CreateProject(ctx, storage.NewProject{TeamID: e.Team.ID, Name: "bare", Repository: "https://example.invalid/bare.git", Branch: "main"}); err != nil {
		t.Fatal(err)
	}
	if e.Cache, err = db.CreateCache(ctx, storage.NewCache{Name: "main"}); err != nil {
		t.Fatal(err)
	}
	if _, err = db.SubscribeProject(ctx, e.Project.ID, e.Cache.ID); err != nil {
		t.Fatal(err)
	}
	return e
}

// Register registers workerID with the peer and returns its token.
func (e *Env) Register(kind storage.PeerKind, peerID, workerID string) string {
	e.T.Helper()
	_, token, err := e.DB.CreateRegistration(e.T.Context(), storage.Peer{Kind: kind, ID: peerID}, workerID, storage.DefaultWorkerSettings())
	if err != nil {
		e.T.Fatal(err)
	}
	e.Remember(token)
	return token
}

// ExpectReject connects and requires a Reject with code and reason.
func (e *Env) ExpectReject(workerID string, tokens map[string]string, code uint16, reason string) {
	e.T.Helper()
	_, err := e.Connect(workerID, tokens)
	var he *handshake.Error
	if !errors.As(err, &he) || !he.Remote || he.Code != code || he.Reason != reason {
		e.T.Fatalf("worker %s: got %v, want Reject %d %q", workerID, err, code, reason)
	}
}

// AssertNoSecretLogged fails the test if the server's log shows
// AdminToken or a remembered token.
func (e *Env) AssertNoSecretLogged() {
	e.T.Helper()
	e.AssertNotLogged(e.T, e.Logs.String())
}

// Admin is a client of this server's admin API presenting AdminToken
// (the server needs Config.AdminTokenHash = SHA256Hex(AdminToken)).
func (e *Env) Admin() *Admin {
	return &Admin{T: e.T, Base: "http" + strings.TrimSuffix(strings.TrimPrefix(e.URL, "ws"), "/proto"), Token: AdminToken}
}

// Worker is a worker built from the session layer, dialing the server.
type Worker struct {
	ID     string
	Est    *session.Established
	Sess   *session.WorkerSession
	Auth   *session.WorkerAuth // answers the server's AuthChallenges with Tokens
	Tokens map[string]string   // by peer ID; a test may add to it
}

// Recv reads the worker's next message, failing t after 10 s.
func (w *Worker) Recv(t testing.TB) wire.ServerMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	m, err := w.Sess.Recv(ctx)
	if err != nil {
		t.Fatalf("worker %s: recv: %v", w.ID, err)
	}
	return m
}

// WorkerCaps are the capabilities a Worker offers.
var WorkerCaps = wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}

// Connect dials the server as workerID with tokens; the session closes
// when the test ends.
func (e *Env) Connect(workerID string, tokens map[string]string) (*Worker, error) {
	ctx, cancel := context.WithTimeout(e.T.Context(), 10*time.Second)
	defer cancel()
	tr, err := session.Dial(ctx, e.URL, session.DialOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: slog.New(slog.DiscardHandler)})
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: workerID, Capabilities: WorkerCaps, Tokens: tokens})
	if err != nil {
		tr.Close(session.CloseNormal, "")
		return nil, err
	}
	w := &Worker{ID: workerID, Est: est, Tokens: tokens, Auth: session.NewWorkerAuth(est, tokens),
		Sess: session.SplitWorker(c, est, session.Options{Logger: slog.New(slog.DiscardHandler)})}
	e.T.Cleanup(func() { w.Sess.Close(session.CloseNormal, "test over") })
	return w, nil
}

// MustConnect is Connect, failing the test on an error.
func (e *Env) MustConnect(workerID string, tokens map[string]string) *Worker {
	e.T.Helper()
	w, err := e.Connect(workerID, tokens)
	if err != nil {
		e.T.Fatalf("worker %s: %v", workerID, err)
	}
	return w
}

// Admin is a client of a server's admin API (/api/v1) at Base,
// presenting Token.
type Admin struct {
	T     testing.TB
	Base  string // the server's http:// URL
	Token string
}

// Call sends an authorized request; body is marshalled unless it is a
// string, which is sent as is.
func (a *Admin) Call(method, path string, body any) (int, []byte) {
	a.T.Helper()
	status, header, raw := a.send(method, path, body)
	if status != http.StatusNoContent && header.Get("Content-Type") != "application/json" {
		a.T.Errorf("%s %s: Content-Type %q", method, path, header.Get("Content-Type"))
	}
	return status, raw
}

// Text sends an authorized GET and returns status, Content-Type and body
// (the log endpoints answer text/plain, which Call refuses).
func (a *Admin) Text(path string) (int, string, string) {
	a.T.Helper()
	status, header, raw := a.send("GET", path, nil)
	return status, header.Get("Content-Type"), string(raw)
}

// send sends an authorized request and reads the whole answer.
func (a *Admin) send(method, path string, body any) (int, http.Header, []byte) {
	a.T.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			a.T.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(a.T.Context(), method, a.Base+path, rd)
	if err != nil {
		a.T.Fatal(err)
	}
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.T.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		a.T.Fatal(err)
	}
	return resp.StatusCode, resp.Header, raw
}

// Must calls and requires status, decoding the response into out.
func (a *Admin) Must(want int, method, path string, body, out any) {
	a.T.Helper()
	got, raw := a.Call(method, path, body)
	if got != want {
		a.T.Fatalf("%s %s: status %d, want %d: %s", method, path, got, want, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			a.T.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
}

// ProjectPath is the admin API path of a project ("team/name" or ID).
func ProjectPath(ref string) string { return "/api/v1/projects/" + url.PathEscape(ref) }
