package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/deploykeys"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

const testAdminToken = "admin-token-for-tests-0123456789"

// dialURL is a worker URL nothing listens on: the server's dialer fails
// fast and keeps retrying in the background.
const dialURL = "ws://127.0.0.1:1/proto"

// adminLogs captures the server's log from handler goroutines.
type adminLogs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *adminLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *adminLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// adminEnv is the admin API over httptest on a real SQLite database.
type adminEnv struct {
	t      *testing.T
	db     *storage.DB
	srv    *Server
	base   string
	token  string // the admin token sent by call
	logs   interface{ String() string }
	mu     sync.Mutex
	issued []string // worker tokens handed out, to search the logs for
}

// newAdminEnv starts the API. Most tests use a SHA-256 admin hash, which
// secret.Verify accepts, so each request skips the argon2id cost;
// TestAdminAuth covers the argon2id form.
func newAdminEnv(t *testing.T, adminHash string) *adminEnv {
	t.Helper()
	key, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	return newAdminEnvWith(t, Config{AdminTokenHash: adminHash, DialKey: key})
}

// newAdminEnvWith starts the API with cfg (its logger is replaced).
func newAdminEnvWith(t *testing.T, cfg Config) *adminEnv {
	t.Helper()
	db, err := storage.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	logs := &adminLogs{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.DialKey != nil && cfg.DeployKeys == nil {
		cfg.DeployKeys = deploykeys.New(db, cfg.DialKey) // as gradient-server makes them
	}
	srv := New(db, cfg)
	hs := httptest.NewServer(srv.Handler())
	e := &adminEnv{t: t, db: db, srv: srv, base: hs.URL, token: testAdminToken, logs: logs}
	t.Cleanup(func() {
		e.assertNoSecretLogged()
		hs.Close()
		srv.Close()
		db.Close()
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	return e
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// call sends an authorized request; body is marshalled unless it is a
// string, which is sent as is.
func (e *adminEnv) call(method, path string, body any) (int, []byte) {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.base+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.token != "" {
		req.Header.Set("Authorization", "Bearer "+e.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNoContent && resp.Header.Get("Content-Type") != "application/json" {
		e.t.Errorf("%s %s: Content-Type %q", method, path, resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, raw
}

// must calls and requires status, decoding the response into out.
func (e *adminEnv) must(want int, method, path string, body, out any) {
	e.t.Helper()
	got, raw := e.call(method, path, body)
	if got != want {
		e.t.Fatalf("%s %s: status %d, want %d: %s", method, path, got, want, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			e.t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
}

// fails requires an error response with status and a message containing
// fragment.
func (e *adminEnv) fails(want int, fragment, method, path string, body any) {
	e.t.Helper()
	got, raw := e.call(method, path, body)
	var eb admin.ErrorBody
	if err := json.Unmarshal(raw, &eb); err != nil || got != want || eb.Error == "" || !strings.Contains(eb.Error, fragment) {
		e.t.Fatalf("%s %s: got %d %s, want %d with an error containing %q", method, path, got, raw, want, fragment)
	}
}

func (e *adminEnv) remember(token string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.issued = append(e.issued, token)
}

func (e *adminEnv) assertNoSecretLogged() {
	e.t.Helper()
	logs := e.logs.String()
	if strings.Contains(logs, testAdminToken) {
		e.t.Error("the admin token appears in the server log")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, tok := range e.issued {
		if strings.Contains(logs, tok) {
			e.t.Error("a worker token appears in the server log")
		}
	}
}

// seed makes team "ops", project ops/web and cache "main".
func (e *adminEnv) seed() (admin.TeamView, admin.ProjectView, admin.CacheView) {
	e.t.Helper()
	var t admin.TeamView
	var p admin.ProjectView
	var c admin.CacheView
	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, &t)
	e.must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://example.invalid/web.git"}, &p)
	e.must(201, "POST", "/api/v1/caches", map[string]any{"name": "main"}, &c)
	return t, p, c
}

// uuidPattern is the text of a UUID, either case.
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// projectPath is a project as one path segment: TEAM%2FPROJECT.
func projectPath(ref string) string { return "/api/v1/projects/" + url.PathEscape(ref) }

func TestAdminAuth(t *testing.T) {
	t.Parallel()
	hash, err := secret.Hash(testAdminToken)
	if err != nil {
		t.Fatal(err)
	}
	e := newAdminEnv(t, hash)
	e.must(200, "GET", "/api/v1/teams", nil, nil)

	e.token = ""
	e.fails(401, "missing admin token", "GET", "/api/v1/teams", nil)
	e.fails(401, "missing admin token", "POST", "/api/v1/teams", map[string]any{"name": "x"})
	e.token = "wrong-" + testAdminToken
	e.fails(401, "wrong admin token", "GET", "/api/v1/server", nil)
	e.fails(401, "wrong admin token", "GET", "/api/v1/no/such/endpoint", nil)

	// Basic auth is not a bearer token.
	req, _ := http.NewRequest("GET", e.base+"/api/v1/teams", nil)
	req.SetBasicAuth("admin", testAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("basic auth: %d, WWW-Authenticate %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}

	e.token = testAdminToken
	e.fails(404, "no such admin endpoint", "GET", "/api/v1/no/such/endpoint", nil)
	// Nothing was created by the unauthorized POST.
	var teams []admin.TeamView
	e.must(200, "GET", "/api/v1/teams", nil, &teams)
	if len(teams) != 0 {
		t.Errorf("teams %v", teams)
	}
	// The rest of the server needs no admin token.
	resp, err = http.Get(e.base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/healthz: %d", resp.StatusCode)
	}
}

func TestAdminDisabledWithoutToken(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, "")
	e.fails(503, "admin API disabled: set an admin token", "GET", "/api/v1/teams", nil)
	e.token = ""
	e.fails(503, "admin API disabled", "GET", "/api/v1/teams", nil)
}

// A worker the server dials needs the server's dial key to seal its token.
func TestAdminDialedWorkerNeedsDialKey(t *testing.T) {
	t.Parallel()
	e := newAdminEnvWith(t, Config{AdminTokenHash: sha256Hex(testAdminToken)})
	e.seed()
	e.fails(400, "dial key", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": "main", "url": dialURL})
	e.fails(400, "dial key", "POST", "/api/v1/teams/ops/workers", map[string]any{"url": dialURL})
	var cred admin.NewCredential
	e.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": "main"}, &cred)
	e.remember(cred.Token)
}

func TestAdminTeams(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	var ops admin.TeamView
	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, &ops)
	if ops.Name != "ops" || ops.ID == "" || ops.CreatedAt.IsZero() {
		t.Fatalf("created %+v", ops)
	}
	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "dev"}, nil)
	e.fails(409, `team "ops" already exists`, "POST", "/api/v1/teams", map[string]any{"name": "ops"})
	e.fails(400, "team name", "POST", "/api/v1/teams", map[string]any{"name": "no spaces"})
	e.fails(400, "team name is empty", "POST", "/api/v1/teams", map[string]any{})
	e.fails(400, "not valid JSON", "POST", "/api/v1/teams", `{"name":`)
	e.fails(400, "body is empty", "POST", "/api/v1/teams", nil)
	e.fails(400, `unknown field "nmae"`, "POST", "/api/v1/teams", `{"nmae":"x"}`)
	e.fails(400, "more than one JSON value", "POST", "/api/v1/teams", `{"name":"a"}{"name":"b"}`)
	e.fails(400, "larger than", "POST", "/api/v1/teams", `{"name":"`+strings.Repeat("a", admin.MaxBody)+`"}`)

	var teams []admin.TeamView
	e.must(200, "GET", "/api/v1/teams", nil, &teams)
	if len(teams) != 2 || teams[0].Name != "dev" || teams[1].Name != "ops" {
		t.Fatalf("list %+v", teams)
	}
	var byID, byName admin.TeamView
	e.must(200, "GET", "/api/v1/teams/"+ops.ID, nil, &byID)
	e.must(200, "GET", "/api/v1/teams/ops", nil, &byName)
	if byID.ID != ops.ID || byName.ID != ops.ID {
		t.Errorf("show by id %+v, by name %+v", byID, byName)
	}
	e.fails(404, `team "nope" does not exist`, "GET", "/api/v1/teams/nope", nil)

	// A team with projects cannot go.
	e.must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://example.invalid/web.git"}, nil)
	e.fails(409, `team "ops" still has projects; delete them first`, "DELETE", "/api/v1/teams/ops", nil)
	if _, raw := e.call("POST", "/api/v1/teams", map[string]any{"name": "ops"}); !strings.Contains(string(raw), `"error": "team \"ops\" already exists"`) {
		t.Errorf("conflict sentence %s", raw)
	}
	e.must(204, "DELETE", projectPath("ops/web"), nil, nil)
	e.must(204, "DELETE", "/api/v1/teams/ops", nil, nil)
	e.fails(404, "does not exist", "DELETE", "/api/v1/teams/ops", nil)
	e.must(204, "DELETE", "/api/v1/teams/dev", nil, nil)
	e.must(200, "GET", "/api/v1/teams", nil, &teams)
	if len(teams) != 0 {
		t.Errorf("after delete %+v", teams)
	}
	// An empty list is [], not null.
	if _, raw := e.call("GET", "/api/v1/teams", nil); strings.TrimSpace(string(raw)) != "[]" {
		t.Errorf("empty list %s", raw)
	}
}

func TestAdminProjects(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	team, web, _ := e.seed()
	if web.Branch != "main" || web.Team != "ops" || web.TeamID != team.ID {
		t.Fatalf("created %+v", web)
	}
	var api admin.ProjectView
	e.must(201, "POST", "/api/v1/projects", map[string]any{"team": team.ID, "name": "api", "repository": "https://example.invalid/api.git", "branch": "release"}, &api)
	if api.Branch != "release" {
		t.Errorf("branch %q", api.Branch)
	}
	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "dev"}, nil)
	e.must(201, "POST", "/api/v1/projects", map[string]any{"team": "dev", "name": "web", "repository": "https://example.invalid/dev.git"}, nil)

	e.fails(409, "already has a project", "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://x.invalid/r"})
	e.fails(404, `team "nope" does not exist`, "POST", "/api/v1/projects", map[string]any{"team": "nope", "name": "x", "repository": "https://x.invalid/r"})
	e.fails(400, "team is empty", "POST", "/api/v1/projects", map[string]any{"name": "x", "repository": "https://x.invalid/r"})
	e.fails(400, "repository URL is empty", "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "x"})

	var all, opsOnly []admin.ProjectView
	e.must(200, "GET", "/api/v1/projects", nil, &all)
	e.must(200, "GET", "/api/v1/projects?team=ops", nil, &opsOnly)
	if len(all) != 3 || len(opsOnly) != 2 || opsOnly[0].Name != "api" || opsOnly[1].Name != "web" {
		t.Fatalf("all %+v, ops %+v", all, opsOnly)
	}
	for _, p := range all {
		if p.Team == "" {
			t.Errorf("project %s without team name", p.ID)
		}
	}
	e.fails(404, "does not exist", "GET", "/api/v1/projects?team=nope", nil)

	var byName, byID, byTeamID admin.ProjectView
	e.must(200, "GET", projectPath("ops/web"), nil, &byName)
	e.must(200, "GET", projectPath(web.ID), nil, &byID)
	e.must(200, "GET", projectPath(team.ID+"/web"), nil, &byTeamID)
	if byName.ID != web.ID || byID.ID != web.ID || byTeamID.ID != web.ID || byName.Repository != web.Repository {
		t.Errorf("show %+v %+v %+v", byName, byID, byTeamID)
	}
	e.fails(404, `project "nope" does not exist in team "ops"`, "GET", projectPath("ops/nope"), nil)
	e.fails(404, "does not exist", "GET", projectPath(storage.NewID()), nil)
	e.fails(400, "TEAM/PROJECT", "GET", projectPath("web"), nil)

	e.must(204, "DELETE", projectPath("ops/api"), nil, nil)
	e.fails(404, "does not exist", "DELETE", projectPath("ops/api"), nil)
}

func TestAdminCaches(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	var main, pub admin.CacheView
	e.must(201, "POST", "/api/v1/caches", map[string]any{"name": "main"}, &main)
	e.must(201, "POST", "/api/v1/caches", map[string]any{"name": "pub", "public": true}, &pub)
	if main.Public || !pub.Public {
		t.Errorf("public flags %v %v", main.Public, pub.Public)
	}
	name, _, err := storage.ParsePublicKey(main.PublicKey)
	if err != nil || name != "main" {
		t.Fatalf("public key %q: %v", main.PublicKey, err)
	}
	e.fails(409, "already exists", "POST", "/api/v1/caches", map[string]any{"name": "main"})
	e.fails(400, "cache name", "POST", "/api/v1/caches", map[string]any{"name": "-bad"})
	e.fails(400, "not valid JSON", "POST", "/api/v1/caches", `{"name": "x", "public": "yes"}`)

	var list []admin.CacheView
	e.must(200, "GET", "/api/v1/caches", nil, &list)
	if len(list) != 2 || list[0].Name != "main" || list[0].PublicKey != main.PublicKey {
		t.Fatalf("list %+v", list)
	}
	// The secret half never leaves the server.
	key, err := e.db.CacheSigningKey(t.Context(), main.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, raw := e.call("GET", "/api/v1/caches/main", nil)
	if strings.Contains(string(raw), key.SecretKeyText()) {
		t.Fatal("show leaks the secret signing key")
	}

	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
	e.must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://x.invalid/r"}, nil)
	e.must(201, "PUT", projectPath("ops/web")+"/caches/main", nil, nil)
	var shown, byID admin.CacheView
	e.must(200, "GET", "/api/v1/caches/main", nil, &shown)
	e.must(200, "GET", "/api/v1/caches/"+main.ID, nil, &byID)
	if shown.PublicKey != main.PublicKey || !slices.Equal(shown.Projects, []string{"ops/web"}) || byID.ID != main.ID {
		t.Errorf("show %+v / %+v", shown, byID)
	}
	e.fails(404, `cache "nope" does not exist`, "GET", "/api/v1/caches/nope", nil)

	e.must(204, "DELETE", "/api/v1/caches/pub", nil, nil)
	e.fails(404, "does not exist", "DELETE", "/api/v1/caches/pub", nil)
}

func TestAdminSubscriptionsAndGrants(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	_, web, _ := e.seed()
	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "builders"}, nil)
	sub := projectPath("ops/web") + "/caches/main"

	var res admin.LinkResult
	e.must(201, "PUT", sub, nil, &res)
	if !res.Added || res.ReauthorizedSessions != 0 {
		t.Errorf("subscribe %+v", res)
	}
	e.must(200, "PUT", sub, nil, &res)
	if res.Added {
		t.Error("second subscribe reported added")
	}
	e.fails(404, `cache "nope"`, "PUT", projectPath("ops/web")+"/caches/nope", nil)
	e.fails(404, "does not exist", "PUT", projectPath(storage.NewID())+"/caches/main", nil)

	grant := projectPath(web.ID) + "/teams/builders"
	e.must(201, "PUT", grant, nil, &res)
	if !res.Added {
		t.Errorf("grant %+v", res)
	}
	e.must(200, "PUT", grant, nil, nil)
	e.fails(404, `team "nobody"`, "PUT", projectPath("ops/web")+"/teams/nobody", nil)

	var shown admin.ProjectView
	e.must(200, "GET", projectPath("ops/web"), nil, &shown)
	if !slices.Equal(shown.Caches, []string{"main"}) || !slices.Equal(shown.GrantedTeams, []string{"builders"}) {
		t.Errorf("show %+v", shown)
	}

	e.must(204, "DELETE", sub, nil, nil)
	e.fails(404, "subscription of project", "DELETE", sub, nil)
	e.must(204, "DELETE", grant, nil, nil)
	e.fails(404, "grant of project", "DELETE", grant, nil)
	shown = admin.ProjectView{}
	e.must(200, "GET", projectPath("ops/web"), nil, &shown)
	if len(shown.Caches) != 0 || len(shown.GrantedTeams) != 0 {
		t.Errorf("after removal %+v", shown)
	}
}

func TestAdminRegistrations(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	ctx := t.Context()
	_, web, cache := e.seed()

	var cred admin.NewCredential
	e.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web"}, &cred)
	e.remember(cred.Token)
	if !uuidPattern.MatchString(cred.WorkerID) || cred.PeerID != web.ID || cred.PeerKind != "project" {
		t.Fatalf("credential %+v", cred)
	}
	if cred.PeersLine != web.ID+":"+cred.Token || !cred.Fetch || !cred.Eval || !cred.Build || !strings.Contains(cred.Note, "only now") {
		t.Errorf("credential %+v", cred)
	}
	// Stored only as a hash that the token verifies against.
	reg, err := e.db.Registration(ctx, storage.Peer{Kind: storage.PeerProject, ID: web.ID}, cred.WorkerID)
	if err != nil {
		t.Fatal(err)
	}
	if reg.TokenHash == cred.Token || !secret.Verify(reg.TokenHash, cred.Token) {
		t.Fatal("the stored hash does not verify the token")
	}

	// The same worker registered by the cache, with chosen settings and
	// an upper-case ID, which is stored lowercase.
	var cacheCred admin.NewCredential
	e.must(201, "POST", "/api/v1/registrations", map[string]any{
		"peer_kind": "cache", "peer": "main", "worker_id": strings.ToUpper(cred.WorkerID),
		"url": dialURL, "build": false, "eval": false,
	}, &cacheCred)
	e.remember(cacheCred.Token)
	// The server dials this worker: the worker must accept the server
	// presenting the token, through a hash line.
	peerID, hash, _ := strings.Cut(cacheCred.AcceptedServerTokenLine, ":")
	if peerID != cache.ID || !secret.Verify(hash, cacheCred.Token) || cred.AcceptedServerTokenLine != "" {
		t.Errorf("accepted server token lines %q / %q", cacheCred.AcceptedServerTokenLine, cred.AcceptedServerTokenLine)
	}
	if cacheCred.WorkerID != cred.WorkerID || cacheCred.PeerID != cache.ID || cacheCred.URL != dialURL ||
		!cacheCred.Fetch || cacheCred.Eval || cacheCred.Build || cacheCred.Token == cred.Token {
		t.Errorf("cache credential %+v", cacheCred)
	}
	proxyID := storage.NewID()
	var proxyCred admin.NewCredential
	e.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "proxy", "peer": proxyID, "worker_id": cred.WorkerID}, &proxyCred)
	e.remember(proxyCred.Token)

	body := map[string]any{"peer_kind": "project", "peer": "ops/web", "worker_id": cred.WorkerID}
	e.fails(409, "already registered", "POST", "/api/v1/registrations", body)
	e.fails(400, "peer kind", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "robot", "peer": "x"})
	e.fails(400, "peer is empty", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project"})
	e.fails(400, "not a UUID", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "proxy", "peer": "my-proxy"})
	e.fails(400, "worker ID", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web", "worker_id": "w1"})
	e.fails(400, "worker URL", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web", "url": "http://x"})
	e.fails(404, "does not exist", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": "nope"})

	// Lists never show a token or its hash.
	var list []admin.RegistrationView
	status, raw := e.call("GET", "/api/v1/registrations?peer_kind=project&peer=ops/web", nil)
	if status != 200 || json.Unmarshal(raw, &list) != nil || len(list) != 1 || list[0].WorkerID != cred.WorkerID {
		t.Fatalf("list: %d %s", status, raw)
	}
	for _, path := range []string{
		"/api/v1/registrations?peer_kind=project&peer=ops/web",
		"/api/v1/registrations?peer_kind=cache&peer=main",
		"/api/v1/registrations?peer_kind=proxy&peer=" + proxyID,
		"/api/v1/workers/" + cred.WorkerID,
	} {
		_, raw := e.call("GET", path, nil)
		for _, secretText := range []string{cred.Token, cacheCred.Token, proxyCred.Token, reg.TokenHash, "argon2id", `"token"`} {
			if strings.Contains(string(raw), secretText) {
				t.Errorf("GET %s shows a token or its hash: %s", path, raw)
			}
		}
	}
	e.fails(400, "peer kind", "GET", "/api/v1/registrations", nil)

	del := "/api/v1/registrations/project/" + url.PathEscape("ops/web") + "/" + cred.WorkerID
	e.must(204, "DELETE", del, nil, nil)
	e.fails(404, "registration of worker", "DELETE", del, nil)
	e.must(204, "DELETE", "/api/v1/registrations/cache/main/"+cred.WorkerID, nil, nil)
	e.fails(400, "worker ID", "DELETE", "/api/v1/registrations/cache/main/not-a-uuid", nil)
}

func TestAdminTeamWorkers(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	team, _, _ := e.seed()
	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "other"}, nil)

	var cred admin.NewCredential
	e.must(201, "POST", "/api/v1/teams/ops/workers", map[string]any{"build": false}, &cred)
	e.remember(cred.Token)
	if cred.PeerKind != "team" || cred.PeerID != team.ID || cred.PeersLine != team.ID+":"+cred.Token || cred.Build || !cred.Eval {
		t.Fatalf("credential %+v", cred)
	}
	tw, err := e.db.TeamWorker(t.Context(), cred.WorkerID)
	if err != nil || !secret.Verify(tw.TokenHash, cred.Token) {
		t.Fatalf("stored team worker %+v: %v", tw, err)
	}
	// A worker ID held by a team worker cannot be registered by a peer.
	e.fails(409, "belongs to a team worker", "POST", "/api/v1/registrations",
		map[string]any{"peer_kind": "project", "peer": "ops/web", "worker_id": cred.WorkerID})
	e.fails(409, "already is a team worker", "POST", "/api/v1/teams/other/workers", map[string]any{"worker_id": cred.WorkerID})
	e.fails(404, "does not exist", "POST", "/api/v1/teams/nope/workers", map[string]any{})

	var list []admin.TeamWorkerView
	status, raw := e.call("GET", "/api/v1/teams/ops/workers", nil)
	if status != 200 || json.Unmarshal(raw, &list) != nil || len(list) != 1 || list[0].WorkerID != cred.WorkerID {
		t.Fatalf("list %d %s", status, raw)
	}
	if strings.Contains(string(raw), cred.Token) || strings.Contains(string(raw), "argon2id") {
		t.Fatal("team worker list shows the token or its hash")
	}

	e.fails(404, `not a worker of team "other"`, "DELETE", "/api/v1/teams/other/workers/"+cred.WorkerID, nil)
	e.must(204, "DELETE", "/api/v1/teams/ops/workers/"+cred.WorkerID, nil, nil)
	e.fails(404, "team worker", "DELETE", "/api/v1/teams/ops/workers/"+cred.WorkerID, nil)
}

func TestAdminWorkersAndServer(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	e.seed()
	var cred admin.NewCredential
	e.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web"}, &cred)
	e.remember(cred.Token)

	var act admin.Activation
	e.must(200, "POST", "/api/v1/workers/"+cred.WorkerID+"/deactivate", nil, &act)
	if !act.Deactivated || act.Live {
		t.Errorf("deactivate %+v", act)
	}
	var shown admin.WorkerView
	e.must(200, "GET", "/api/v1/workers/"+cred.WorkerID, nil, &shown)
	if !shown.Deactivated || shown.Live || len(shown.Registrations) != 1 || shown.Registrations[0].PeerKind != "project" {
		t.Errorf("show %+v", shown)
	}
	var workers []admin.ProjectWorker
	e.must(200, "GET", projectPath("ops/web")+"/workers", nil, &workers)
	if len(workers) != 1 || workers[0].WorkerID != cred.WorkerID || !workers[0].Deactivated || workers[0].Live {
		t.Errorf("project workers %+v", workers)
	}
	e.must(200, "POST", "/api/v1/workers/"+strings.ToUpper(cred.WorkerID)+"/activate", nil, &act)
	if act.Deactivated || act.WorkerID != cred.WorkerID {
		t.Errorf("activate %+v", act)
	}
	unknown := storage.NewID()
	e.fails(404, "no registration or team worker", "POST", "/api/v1/workers/"+unknown+"/deactivate", nil)
	e.fails(404, "no registration or team worker", "GET", "/api/v1/workers/"+unknown, nil)
	e.fails(400, "not a UUID", "POST", "/api/v1/workers/w1/activate", nil)
	e.fails(400, "TEAM/PROJECT", "GET", projectPath("web")+"/workers", nil)

	var state admin.ServerView
	e.must(200, "GET", "/api/v1/server", nil, &state)
	if !state.Accepting {
		t.Error("a new server does not accept")
	}
	e.must(200, "POST", "/api/v1/server/stop-accepting", nil, &state)
	if state.Accepting || e.srv.Accepting() {
		t.Error("still accepting after stop-accepting")
	}
	e.must(200, "POST", "/api/v1/server/resume-accepting", nil, &state)
	if !state.Accepting || !e.srv.Accepting() {
		t.Error("not accepting after resume-accepting")
	}
	e.fails(404, "no such admin endpoint", "GET", "/api/v1/server/stop-accepting", nil)
}

// An unexpected failure answers 500 with a reference into the log, never
// the underlying error.
func TestAdminInternalError(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	e.db.Close()
	status, raw := e.call("GET", "/api/v1/teams", nil)
	var eb admin.ErrorBody
	if status != 500 || json.Unmarshal(raw, &eb) != nil || !strings.HasPrefix(eb.Error, "internal error (ref ") {
		t.Fatalf("got %d %s", status, raw)
	}
	if strings.Contains(eb.Error, "closed") {
		t.Errorf("the response leaks the cause: %s", eb.Error)
	}
	ref := strings.TrimSuffix(strings.TrimPrefix(eb.Error, "internal error (ref "), "): the server log has the details")
	if !strings.Contains(e.logs.String(), "ref="+ref) {
		t.Errorf("ref %s not in the log:\n%s", ref, e.logs.String())
	}
}

// Registering, subscribing and granting through the API challenge live
// sessions again, so new peers join without a reconnect (docs/protocol/connection.md).
func TestAdminChangesReauthLiveWorkers(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) { testAdminChangesReauthLiveWorkers(t, db) })
}

func testAdminChangesReauthLiveWorkers(t *testing.T, db *storage.DB) {
	live := newEnv(t, db, Config{AdminTokenHash: sha256Hex(testAdminToken)})
	api := &adminEnv{t: t, db: db, srv: live.srv, base: "http" + strings.TrimSuffix(strings.TrimPrefix(live.url, "ws"), "/proto"),
		token: testAdminToken, logs: live.logs}

	// A live worker of ops/web (which has a cache).
	id := storage.NewID()
	first := live.register(storage.PeerProject, live.project.ID, id)
	w := live.mustConnect(id, map[string]string{live.project.ID: first})

	// A registration by the cache challenges it.
	var cred admin.NewCredential
	api.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": live.cache.Name, "worker_id": id}, &cred)
	live.remember(cred.Token)
	if !cred.Reauthorized {
		t.Error("registration did not reauth the live worker")
	}
	ch, ok := w.recv(t).(*wire.AuthChallenge)
	if !ok || !slices.Contains(ch.Peers, live.cache.ID) {
		t.Fatalf("challenge %#v", ch)
	}
	w.tokens[live.cache.ID] = cred.Token
	w.sess.Send(w.auth.Answer(ch))
	if up, ok := w.recv(t).(*wire.AuthUpdate); !ok || !slices.Contains(up.AuthorizedPeers, live.cache.ID) {
		t.Fatalf("update %#v", up)
	}

	// The bare project registers the worker (its project fails: no cache),
	// then subscribes to the cache, which reauths the project's workers.
	api.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": live.bare.ID, "worker_id": id}, &cred)
	live.remember(cred.Token)
	w.tokens[live.bare.ID] = cred.Token
	ch, _ = w.recv(t).(*wire.AuthChallenge)
	w.sess.Send(w.auth.Answer(ch))
	if _, ok := w.recv(t).(*wire.AuthUpdate); !ok {
		t.Fatal("no AuthUpdate after the bare project's registration")
	}
	if slices.Contains(live.srv.WorkerStatus(id).Projects, live.bare.ID) {
		t.Fatal("a project without a cache was granted")
	}
	var res admin.LinkResult
	api.must(201, "PUT", projectPath(live.bare.ID)+"/caches/"+live.cache.Name, nil, &res)
	if res.ReauthorizedSessions != 1 {
		t.Errorf("subscribe reauthorized %d sessions", res.ReauthorizedSessions)
	}
	ch, _ = w.recv(t).(*wire.AuthChallenge)
	w.sess.Send(w.auth.Answer(ch))
	if _, ok := w.recv(t).(*wire.AuthUpdate); !ok {
		t.Fatal("no AuthUpdate after the subscription")
	}
	var workers []admin.ProjectWorker
	api.must(200, "GET", projectPath(live.bare.ID)+"/workers", nil, &workers)
	if len(workers) != 1 || !workers[0].Live {
		t.Errorf("bare project's workers %+v", workers)
	}
	var shown admin.WorkerView
	api.must(200, "GET", "/api/v1/workers/"+id, nil, &shown)
	if !shown.Live || len(shown.Registrations) != 3 {
		t.Errorf("worker %+v", shown)
	}
	var state admin.ServerView
	api.must(200, "GET", "/api/v1/server", nil, &state)
	if state.ConnectedWorkers != 1 {
		t.Errorf("server %+v", state)
	}

	// A grant reauths the team's live team workers.
	var tcred admin.NewCredential
	api.must(201, "POST", "/api/v1/teams", map[string]any{"name": "builders"}, nil)
	api.must(201, "POST", "/api/v1/teams/builders/workers", map[string]any{}, &tcred)
	live.remember(tcred.Token)
	api.must(201, "PUT", projectPath("ops/web")+"/teams/builders", nil, nil)
	tw := live.mustConnect(tcred.WorkerID, map[string]string{tcred.PeerID: tcred.Token})
	api.must(201, "PUT", projectPath("ops/bare")+"/teams/builders", nil, &res)
	if res.ReauthorizedSessions != 1 {
		t.Errorf("grant reauthorized %d sessions", res.ReauthorizedSessions)
	}
	ch, _ = tw.recv(t).(*wire.AuthChallenge)
	tw.sess.Send(tw.auth.Answer(ch))
	if _, ok := tw.recv(t).(*wire.AuthUpdate); !ok {
		t.Fatal("no AuthUpdate after the grant")
	}
	waitfor.True(t, "the team worker to join ops/bare", func() bool {
		return slices.Contains(live.srv.WorkerStatus(tcred.WorkerID).Projects, live.bare.ID)
	})
	api.assertNoSecretLogged()
	live.assertNoTokenLogged()
}
