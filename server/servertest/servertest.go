// Package servertest runs a real server on loopback for the tests of the
// server's parts that live beside them (server/cache): a database with
// one team, one project subscribed to one cache and a second project
// without a cache, and workers built from the session layer that dial it.
package servertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
}

// NewEnv starts a server with cfg (its logger replaced by Logs) until the
// test ends.
func NewEnv(t testing.TB, db *storage.DB, cfg server.Config) *Env {
	t.Helper()
	ctx := t.Context()
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
			t.Logf("server log:\n%s", logs.String())
		}
	})
	e := &Env{T: t, DB: db, Srv: srv, URL: "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto", Logs: logs}
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
	return token
}

// Worker is a worker built from the session layer, dialing the server.
type Worker struct {
	ID   string
	Sess *session.WorkerSession
}

// workerCaps are the capabilities a Worker offers.
var workerCaps = wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}

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
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: workerID, Capabilities: workerCaps, Tokens: tokens})
	if err != nil {
		tr.Close(session.CloseNormal, "")
		return nil, err
	}
	w := &Worker{ID: workerID, Sess: session.SplitWorker(c, est, session.Options{Logger: slog.New(slog.DiscardHandler)})}
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
	if resp.StatusCode != http.StatusNoContent && resp.Header.Get("Content-Type") != "application/json" {
		a.T.Errorf("%s %s: Content-Type %q", method, path, resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, raw
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
