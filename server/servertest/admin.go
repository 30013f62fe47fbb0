package servertest

import (
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/deploykeys"
	"gradient.dev/gradient/storage"
)

// AdminEnv is the admin API over httptest on a fresh SQLite database, with
// nothing in it; its embedded Admin presents AdminToken.
type AdminEnv struct {
	*Admin
	DB      *storage.DB
	Srv     *server.Server
	Logs    *testlog.Buffer
	DialKey *sealbox.Box // the server's dial key (nil without one)
	Secrets
}

// NewAdminEnv starts the API with the admin token hash adminHash and a
// dial key. Most tests use SHA256Hex(AdminToken), which secret.Verify
// accepts, so each request skips the argon2id cost.
func NewAdminEnv(t *testing.T, adminHash string) *AdminEnv {
	t.Helper()
	key, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	return NewAdminEnvWith(t, server.Config{AdminTokenHash: adminHash, DialKey: key})
}

// NewAdminEnvWith starts the API with cfg (its logger replaced by Logs;
// with a dial key, deploy keys as gradient-server makes them). When the
// test ends, neither AdminToken nor a remembered token may be in the log.
func NewAdminEnvWith(t *testing.T, cfg server.Config) *AdminEnv {
	t.Helper()
	db, err := storage.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.DialKey != nil && cfg.DeployKeys == nil {
		cfg.DeployKeys = deploykeys.New(db, cfg.DialKey)
	}
	srv := server.New(db, cfg)
	hs := httptest.NewServer(srv.Handler())
	e := &AdminEnv{Admin: &Admin{T: t, Base: hs.URL, Token: AdminToken}, DB: db, Srv: srv, Logs: logs, DialKey: cfg.DialKey}
	t.Cleanup(func() {
		e.AssertNotLogged(t, logs.String())
		hs.Close()
		srv.Close()
		db.Close()
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	return e
}

// Seed makes team "ops", project ops/web and cache "main" through the API.
func (e *AdminEnv) Seed() (admin.TeamView, admin.ProjectView, admin.CacheView) {
	e.T.Helper()
	var t admin.TeamView
	var p admin.ProjectView
	var c admin.CacheView
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, &t)
	e.Must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://example.invalid/web.git"}, &p)
	e.Must(201, "POST", "/api/v1/caches", map[string]any{"name": "main"}, &c)
	return t, p, c
}

// Fails requires an error response with status and a message containing
// fragment.
func (a *Admin) Fails(want int, fragment, method, path string, body any) {
	a.T.Helper()
	got, raw := a.Call(method, path, body)
	var eb admin.ErrorBody
	if err := json.Unmarshal(raw, &eb); err != nil || got != want || eb.Error == "" || !strings.Contains(eb.Error, fragment) {
		a.T.Fatalf("%s %s: got %d %s, want %d with an error containing %q", method, path, got, raw, want, fragment)
	}
}

// Secrets are the tokens a test handed out, which the server's log must
// never show (nor AdminToken).
type Secrets struct {
	mu     sync.Mutex
	issued []string
}

// Remember adds token to what the log must not show.
func (s *Secrets) Remember(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.issued = append(s.issued, token)
}

// AssertNotLogged fails t if logs show AdminToken or a remembered token.
func (s *Secrets) AssertNotLogged(t testing.TB, logs string) {
	t.Helper()
	if strings.Contains(logs, AdminToken) {
		t.Error("the admin token appears in the server log")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, tok := range s.issued {
		if strings.Contains(logs, tok) {
			t.Error("a worker token appears in the server log")
		}
	}
}
