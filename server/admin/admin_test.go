package admin_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// dialURL is a worker URL nothing listens on: the server's dialer fails
// fast and keeps retrying in the background.
const dialURL = "ws://127.0.0.1:1/proto"

// uuidPattern is the text of a UUID, either case.
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

func TestAdminAuth(t *testing.T) {
	t.Parallel()
	hash, err := secret.Hash(servertest.AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	e := servertest.NewAdminEnv(t, hash)
	e.Must(200, "GET", "/api/v1/teams", nil, nil)

	e.Token = ""
	e.Fails(401, "missing admin token", "GET", "/api/v1/teams", nil)
	e.Fails(401, "missing admin token", "POST", "/api/v1/teams", map[string]any{"name": "x"})
	e.Token = "wrong-" + servertest.AdminToken
	e.Fails(401, "wrong admin token", "GET", "/api/v1/server", nil)
	e.Fails(401, "wrong admin token", "GET", "/api/v1/no/such/endpoint", nil)

	// Basic auth is not a bearer token.
	req, _ := http.NewRequest("GET", e.Base+"/api/v1/teams", nil)
	req.SetBasicAuth("admin", servertest.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("basic auth: %d, WWW-Authenticate %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}

	e.Token = servertest.AdminToken
	e.Fails(404, "no such admin endpoint", "GET", "/api/v1/no/such/endpoint", nil)
	// Nothing was created by the unauthorized POST.
	var teams []admin.TeamView
	e.Must(200, "GET", "/api/v1/teams", nil, &teams)
	if len(teams) != 0 {
		t.Errorf("teams %v", teams)
	}
	// The rest of the server needs no admin token.
	resp, err = http.Get(e.Base + "/healthz")
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
	e := servertest.NewAdminEnv(t, "")
	e.Fails(503, "admin API disabled: set an admin token", "GET", "/api/v1/teams", nil)
	e.Token = ""
	e.Fails(503, "admin API disabled", "GET", "/api/v1/teams", nil)
}

// A worker the server dials needs the server's dial key to seal its token.
func TestAdminDialedWorkerNeedsDialKey(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnvWith(t, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken)})
	e.Seed()
	e.Fails(400, "dial key", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": "main", "url": dialURL})
	e.Fails(400, "dial key", "POST", "/api/v1/teams/ops/workers", map[string]any{"url": dialURL})
	var cred admin.NewCredential
	e.Must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": "main"}, &cred)
	e.Remember(cred.Token)
}

func TestAdminTeams(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	var ops admin.TeamView
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, &ops)
	if ops.Name != "ops" || ops.ID == "" || ops.CreatedAt.IsZero() {
		t.Fatalf("created %+v", ops)
	}
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "dev"}, nil)
	e.Fails(409, `team "ops" already exists`, "POST", "/api/v1/teams", map[string]any{"name": "ops"})
	e.Fails(400, "team name", "POST", "/api/v1/teams", map[string]any{"name": "no spaces"})
	e.Fails(400, "team name is empty", "POST", "/api/v1/teams", map[string]any{})
	e.Fails(400, "not valid JSON", "POST", "/api/v1/teams", `{"name":`)
	e.Fails(400, "body is empty", "POST", "/api/v1/teams", nil)
	e.Fails(400, `unknown field "nmae"`, "POST", "/api/v1/teams", `{"nmae":"x"}`)
	e.Fails(400, "more than one JSON value", "POST", "/api/v1/teams", `{"name":"a"}{"name":"b"}`)
	e.Fails(400, "larger than", "POST", "/api/v1/teams", `{"name":"`+strings.Repeat("a", admin.MaxBody)+`"}`)

	var teams []admin.TeamView
	e.Must(200, "GET", "/api/v1/teams", nil, &teams)
	if len(teams) != 2 || teams[0].Name != "dev" || teams[1].Name != "ops" {
		t.Fatalf("list %+v", teams)
	}
	var byID, byName admin.TeamView
	e.Must(200, "GET", "/api/v1/teams/"+ops.ID, nil, &byID)
	e.Must(200, "GET", "/api/v1/teams/ops", nil, &byName)
	if byID.ID != ops.ID || byName.ID != ops.ID {
		t.Errorf("show by id %+v, by name %+v", byID, byName)
	}
	e.Fails(404, `team "nope" does not exist`, "GET", "/api/v1/teams/nope", nil)

	// A team with projects cannot go.
	e.Must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://example.invalid/web.git"}, nil)
	e.Fails(409, `team "ops" still has projects; delete them first`, "DELETE", "/api/v1/teams/ops", nil)
	if _, raw := e.Call("POST", "/api/v1/teams", map[string]any{"name": "ops"}); !strings.Contains(string(raw), `"error": "team \"ops\" already exists"`) {
		t.Errorf("conflict sentence %s", raw)
	}
	e.Must(204, "DELETE", servertest.ProjectPath("ops/web"), nil, nil)
	e.Must(204, "DELETE", "/api/v1/teams/ops", nil, nil)
	e.Fails(404, "does not exist", "DELETE", "/api/v1/teams/ops", nil)
	e.Must(204, "DELETE", "/api/v1/teams/dev", nil, nil)
	e.Must(200, "GET", "/api/v1/teams", nil, &teams)
	if len(teams) != 0 {
		t.Errorf("after delete %+v", teams)
	}
	// An empty list is [], not null.
	if _, raw := e.Call("GET", "/api/v1/teams", nil); strings.TrimSpace(string(raw)) != "[]" {
		t.Errorf("empty list %s", raw)
	}
}

func TestAdminProjects(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	team, web, _ := e.Seed()
	if web.Branch != "main" || web.Team != "ops" || web.TeamID != team.ID {
		t.Fatalf("created %+v", web)
	}
	var api admin.ProjectView
	e.Must(201, "POST", "/api/v1/projects", map[string]any{"team": team.ID, "name": "api", "repository": "https://example.invalid/api.git", "branch": "release"}, &api)
	if api.Branch != "release" {
		t.Errorf("branch %q", api.Branch)
	}
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "dev"}, nil)
	e.Must(201, "POST", "/api/v1/projects", map[string]any{"team": "dev", "name": "web", "repository": "https://example.invalid/dev.git"}, nil)

	e.Fails(409, "already has a project", "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://x.invalid/r"})
	e.Fails(404, `team "nope" does not exist`, "POST", "/api/v1/projects", map[string]any{"team": "nope", "name": "x", "repository": "https://x.invalid/r"})
	e.Fails(400, "team is empty", "POST", "/api/v1/projects", map[string]any{"name": "x", "repository": "https://x.invalid/r"})
	e.Fails(400, "repository URL is empty", "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "x"})

	var all, opsOnly []admin.ProjectView
	e.Must(200, "GET", "/api/v1/projects", nil, &all)
	e.Must(200, "GET", "/api/v1/projects?team=ops", nil, &opsOnly)
	if len(all) != 3 || len(opsOnly) != 2 || opsOnly[0].Name != "api" || opsOnly[1].Name != "web" {
		t.Fatalf("all %+v, ops %+v", all, opsOnly)
	}
	for _, p := range all {
		if p.Team == "" {
			t.Errorf("project %s without team name", p.ID)
		}
	}
	e.Fails(404, "does not exist", "GET", "/api/v1/projects?team=nope", nil)

	var byName, byID, byTeamID admin.ProjectView
	e.Must(200, "GET", servertest.ProjectPath("ops/web"), nil, &byName)
	e.Must(200, "GET", servertest.ProjectPath(web.ID), nil, &byID)
	e.Must(200, "GET", servertest.ProjectPath(team.ID+"/web"), nil, &byTeamID)
	if byName.ID != web.ID || byID.ID != web.ID || byTeamID.ID != web.ID || byName.Repository != web.Repository {
		t.Errorf("show %+v %+v %+v", byName, byID, byTeamID)
	}
	e.Fails(404, `project "nope" does not exist in team "ops"`, "GET", servertest.ProjectPath("ops/nope"), nil)
	e.Fails(404, "does not exist", "GET", servertest.ProjectPath(storage.NewID()), nil)
	e.Fails(400, "TEAM/PROJECT", "GET", servertest.ProjectPath("web"), nil)

	e.Must(204, "DELETE", servertest.ProjectPath("ops/api"), nil, nil)
	e.Fails(404, "does not exist", "DELETE", servertest.ProjectPath("ops/api"), nil)
}

func TestAdminCaches(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	var main, pub admin.CacheView
	e.Must(201, "POST", "/api/v1/caches", map[string]any{"name": "main"}, &main)
	e.Must(201, "POST", "/api/v1/caches", map[string]any{"name": "pub", "public": true}, &pub)
	if main.Public || !pub.Public {
		t.Errorf("public flags %v %v", main.Public, pub.Public)
	}
	name, _, err := storage.ParsePublicKey(main.PublicKey)
	if err != nil || name != "main" {
		t.Fatalf("public key %q: %v", main.PublicKey, err)
	}
	e.Fails(409, "already exists", "POST", "/api/v1/caches", map[string]any{"name": "main"})
	e.Fails(400, "cache name", "POST", "/api/v1/caches", map[string]any{"name": "-bad"})
	e.Fails(400, "not valid JSON", "POST", "/api/v1/caches", `{"name": "x", "public": "yes"}`)

	var list []admin.CacheView
	e.Must(200, "GET", "/api/v1/caches", nil, &list)
	if len(list) != 2 || list[0].Name != "main" || list[0].PublicKey != main.PublicKey {
		t.Fatalf("list %+v", list)
	}
	// The secret half never leaves the server.
	key, err := e.DB.CacheSigningKey(t.Context(), main.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, raw := e.Call("GET", "/api/v1/caches/main", nil)
	if strings.Contains(string(raw), key.SecretKeyText()) {
		t.Fatal("show leaks the secret signing key")
	}

	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
	e.Must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://x.invalid/r"}, nil)
	e.Must(201, "PUT", servertest.ProjectPath("ops/web")+"/caches/main", nil, nil)
	var shown, byID admin.CacheView
	e.Must(200, "GET", "/api/v1/caches/main", nil, &shown)
	e.Must(200, "GET", "/api/v1/caches/"+main.ID, nil, &byID)
	if shown.PublicKey != main.PublicKey || !slices.Equal(shown.Projects, []string{"ops/web"}) || byID.ID != main.ID {
		t.Errorf("show %+v / %+v", shown, byID)
	}
	e.Fails(404, `cache "nope" does not exist`, "GET", "/api/v1/caches/nope", nil)

	e.Must(204, "DELETE", "/api/v1/caches/pub", nil, nil)
	e.Fails(404, "does not exist", "DELETE", "/api/v1/caches/pub", nil)
}

func TestAdminSubscriptionsAndGrants(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	_, web, _ := e.Seed()
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "builders"}, nil)
	sub := servertest.ProjectPath("ops/web") + "/caches/main"

	var res admin.LinkResult
	e.Must(201, "PUT", sub, nil, &res)
	if !res.Added || res.ReauthorizedSessions != 0 {
		t.Errorf("subscribe %+v", res)
	}
	e.Must(200, "PUT", sub, nil, &res)
	if res.Added {
		t.Error("second subscribe reported added")
	}
	e.Fails(404, `cache "nope"`, "PUT", servertest.ProjectPath("ops/web")+"/caches/nope", nil)
	e.Fails(404, "does not exist", "PUT", servertest.ProjectPath(storage.NewID())+"/caches/main", nil)

	grant := servertest.ProjectPath(web.ID) + "/teams/builders"
	e.Must(201, "PUT", grant, nil, &res)
	if !res.Added {
		t.Errorf("grant %+v", res)
	}
	e.Must(200, "PUT", grant, nil, nil)
	e.Fails(404, `team "nobody"`, "PUT", servertest.ProjectPath("ops/web")+"/teams/nobody", nil)

	var shown admin.ProjectView
	e.Must(200, "GET", servertest.ProjectPath("ops/web"), nil, &shown)
	if !slices.Equal(shown.Caches, []string{"main"}) || !slices.Equal(shown.GrantedTeams, []string{"builders"}) {
		t.Errorf("show %+v", shown)
	}

	e.Must(204, "DELETE", sub, nil, nil)
	e.Fails(404, "subscription of project", "DELETE", sub, nil)
	e.Must(204, "DELETE", grant, nil, nil)
	e.Fails(404, "grant of project", "DELETE", grant, nil)
	shown = admin.ProjectView{}
	e.Must(200, "GET", servertest.ProjectPath("ops/web"), nil, &shown)
	if len(shown.Caches) != 0 || len(shown.GrantedTeams) != 0 {
		t.Errorf("after removal %+v", shown)
	}
}

func TestAdminRegistrations(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	ctx := t.Context()
	_, web, cache := e.Seed()

	var cred admin.NewCredential
	e.Must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web"}, &cred)
	e.Remember(cred.Token)
	if !uuidPattern.MatchString(cred.WorkerID) || cred.PeerID != web.ID || cred.PeerKind != "project" {
		t.Fatalf("credential %+v", cred)
	}
	if cred.PeersLine != web.ID+":"+cred.Token || !cred.Fetch || !cred.Eval || !cred.Build || !strings.Contains(cred.Note, "only now") {
		t.Errorf("credential %+v", cred)
	}
	// Stored only as a hash that the token verifies against.
	reg, err := e.DB.Registration(ctx, storage.Peer{Kind: storage.PeerProject, ID: web.ID}, cred.WorkerID)
	if err != nil {
		t.Fatal(err)
	}
	if reg.TokenHash == cred.Token || !secret.Verify(reg.TokenHash, cred.Token) {
		t.Fatal("the stored hash does not verify the token")
	}

	// The same worker registered by the cache, with chosen settings and
	// an upper-case ID, which is stored lowercase.
	var cacheCred admin.NewCredential
	e.Must(201, "POST", "/api/v1/registrations", map[string]any{
		"peer_kind": "cache", "peer": "main", "worker_id": strings.ToUpper(cred.WorkerID),
		"url": dialURL, "build": false, "eval": false,
	}, &cacheCred)
	e.Remember(cacheCred.Token)
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
	e.Must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "proxy", "peer": proxyID, "worker_id": cred.WorkerID}, &proxyCred)
	e.Remember(proxyCred.Token)

	body := map[string]any{"peer_kind": "project", "peer": "ops/web", "worker_id": cred.WorkerID}
	e.Fails(409, "already registered", "POST", "/api/v1/registrations", body)
	e.Fails(400, "peer kind", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "robot", "peer": "x"})
	e.Fails(400, "peer is empty", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project"})
	e.Fails(400, "not a UUID", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "proxy", "peer": "my-proxy"})
	e.Fails(400, "worker ID", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web", "worker_id": "w1"})
	e.Fails(400, "worker URL", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web", "url": "http://x"})
	e.Fails(404, "does not exist", "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": "nope"})

	// Lists never show a token or its hash.
	var list []admin.RegistrationView
	status, raw := e.Call("GET", "/api/v1/registrations?peer_kind=project&peer=ops/web", nil)
	if status != 200 || json.Unmarshal(raw, &list) != nil || len(list) != 1 || list[0].WorkerID != cred.WorkerID {
		t.Fatalf("list: %d %s", status, raw)
	}
	for _, path := range []string{
		"/api/v1/registrations?peer_kind=project&peer=ops/web",
		"/api/v1/registrations?peer_kind=cache&peer=main",
		"/api/v1/registrations?peer_kind=proxy&peer=" + proxyID,
		"/api/v1/workers/" + cred.WorkerID,
	} {
		_, raw := e.Call("GET", path, nil)
		for _, secretText := range []string{cred.Token, cacheCred.Token, proxyCred.Token, reg.TokenHash, "argon2id", `"token"`} {
			if strings.Contains(string(raw), secretText) {
				t.Errorf("GET %s shows a token or its hash: %s", path, raw)
			}
		}
	}
	e.Fails(400, "peer kind", "GET", "/api/v1/registrations", nil)

	del := "/api/v1/registrations/project/" + url.PathEscape("ops/web") + "/" + cred.WorkerID
	e.Must(204, "DELETE", del, nil, nil)
	e.Fails(404, "registration of worker", "DELETE", del, nil)
	e.Must(204, "DELETE", "/api/v1/registrations/cache/main/"+cred.WorkerID, nil, nil)
	e.Fails(400, "worker ID", "DELETE", "/api/v1/registrations/cache/main/not-a-uuid", nil)
}

func TestAdminTeamWorkers(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	team, _, _ := e.Seed()
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "other"}, nil)

	var cred admin.NewCredential
	e.Must(201, "POST", "/api/v1/teams/ops/workers", map[string]any{"build": false}, &cred)
	e.Remember(cred.Token)
	if cred.PeerKind != "team" || cred.PeerID != team.ID || cred.PeersLine != team.ID+":"+cred.Token || cred.Build || !cred.Eval {
		t.Fatalf("credential %+v", cred)
	}
	tw, err := e.DB.TeamWorker(t.Context(), cred.WorkerID)
	if err != nil || !secret.Verify(tw.TokenHash, cred.Token) {
		t.Fatalf("stored team worker %+v: %v", tw, err)
	}
	// A worker ID held by a team worker cannot be registered by a peer.
	e.Fails(409, "belongs to a team worker", "POST", "/api/v1/registrations",
		map[string]any{"peer_kind": "project", "peer": "ops/web", "worker_id": cred.WorkerID})
	e.Fails(409, "already is a team worker", "POST", "/api/v1/teams/other/workers", map[string]any{"worker_id": cred.WorkerID})
	e.Fails(404, "does not exist", "POST", "/api/v1/teams/nope/workers", map[string]any{})

	var list []admin.TeamWorkerView
	status, raw := e.Call("GET", "/api/v1/teams/ops/workers", nil)
	if status != 200 || json.Unmarshal(raw, &list) != nil || len(list) != 1 || list[0].WorkerID != cred.WorkerID {
		t.Fatalf("list %d %s", status, raw)
	}
	if strings.Contains(string(raw), cred.Token) || strings.Contains(string(raw), "argon2id") {
		t.Fatal("team worker list shows the token or its hash")
	}

	e.Fails(404, `not a worker of team "other"`, "DELETE", "/api/v1/teams/other/workers/"+cred.WorkerID, nil)
	e.Must(204, "DELETE", "/api/v1/teams/ops/workers/"+cred.WorkerID, nil, nil)
	e.Fails(404, "team worker", "DELETE", "/api/v1/teams/ops/workers/"+cred.WorkerID, nil)
}

func TestAdminWorkersAndServer(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	e.Seed()
	var cred admin.NewCredential
	e.Must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web"}, &cred)
	e.Remember(cred.Token)

	var act admin.Activation
	e.Must(200, "POST", "/api/v1/workers/"+cred.WorkerID+"/deactivate", nil, &act)
	if !act.Deactivated || act.Live {
		t.Errorf("deactivate %+v", act)
	}
	var shown admin.WorkerView
	e.Must(200, "GET", "/api/v1/workers/"+cred.WorkerID, nil, &shown)
	if !shown.Deactivated || shown.Live || len(shown.Registrations) != 1 || shown.Registrations[0].PeerKind != "project" {
		t.Errorf("show %+v", shown)
	}
	var workers []admin.ProjectWorker
	e.Must(200, "GET", servertest.ProjectPath("ops/web")+"/workers", nil, &workers)
	if len(workers) != 1 || workers[0].WorkerID != cred.WorkerID || !workers[0].Deactivated || workers[0].Live {
		t.Errorf("project workers %+v", workers)
	}
	e.Must(200, "POST", "/api/v1/workers/"+strings.ToUpper(cred.WorkerID)+"/activate", nil, &act)
	if act.Deactivated || act.WorkerID != cred.WorkerID {
		t.Errorf("activate %+v", act)
	}
	unknown := storage.NewID()
	e.Fails(404, "no registration or team worker", "POST", "/api/v1/workers/"+unknown+"/deactivate", nil)
	e.Fails(404, "no registration or team worker", "GET", "/api/v1/workers/"+unknown, nil)
	e.Fails(400, "not a UUID", "POST", "/api/v1/workers/w1/activate", nil)
	e.Fails(400, "TEAM/PROJECT", "GET", servertest.ProjectPath("web")+"/workers", nil)

	var state admin.ServerView
	e.Must(200, "GET", "/api/v1/server", nil, &state)
	if !state.Accepting {
		t.Error("a new server does not accept")
	}
	e.Must(200, "POST", "/api/v1/server/stop-accepting", nil, &state)
	if state.Accepting || e.Srv.Accepting() {
		t.Error("still accepting after stop-accepting")
	}
	e.Must(200, "POST", "/api/v1/server/resume-accepting", nil, &state)
	if !state.Accepting || !e.Srv.Accepting() {
		t.Error("not accepting after resume-accepting")
	}
	e.Fails(404, "no such admin endpoint", "GET", "/api/v1/server/stop-accepting", nil)
}

// An unexpected failure answers 500 with a reference into the log, never
// the underlying error.
func TestAdminInternalError(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	e.DB.Close()
	status, raw := e.Call("GET", "/api/v1/teams", nil)
	var eb admin.ErrorBody
	if status != 500 || json.Unmarshal(raw, &eb) != nil || !strings.HasPrefix(eb.Error, "internal error (ref ") {
		t.Fatalf("got %d %s", status, raw)
	}
	if strings.Contains(eb.Error, "closed") {
		t.Errorf("the response leaks the cause: %s", eb.Error)
	}
	ref := strings.TrimSuffix(strings.TrimPrefix(eb.Error, "internal error (ref "), "): the server log has the details")
	if !strings.Contains(e.Logs.String(), "ref="+ref) {
		t.Errorf("ref %s not in the log:\n%s", ref, e.Logs.String())
	}
}

// Registering, subscribing and granting through the API challenge live
// sessions again, so new peers join without a reconnect (docs/protocol/connection.md).
func TestAdminChangesReauthLiveWorkers(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) { testAdminChangesReauthLiveWorkers(t, db) })
}

func testAdminChangesReauthLiveWorkers(t *testing.T, db *storage.DB) {
	live := servertest.NewEnv(t, db, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken)})
	api := live.Admin()

	// A live worker of ops/web (which has a cache).
	id := storage.NewID()
	first := live.Register(storage.PeerProject, live.Project.ID, id)
	w := live.MustConnect(id, map[string]string{live.Project.ID: first})

	// A registration by the cache challenges it.
	var cred admin.NewCredential
	api.Must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": live.Cache.Name, "worker_id": id}, &cred)
	live.Remember(cred.Token)
	if !cred.Reauthorized {
		t.Error("registration did not reauth the live worker")
	}
	ch, ok := w.Recv(t).(*wire.AuthChallenge)
	if !ok || !slices.Contains(ch.Peers, live.Cache.ID) {
		t.Fatalf("challenge %#v", ch)
	}
	w.Tokens[live.Cache.ID] = cred.Token
	w.Sess.Send(w.Auth.Answer(ch))
	if up, ok := w.Recv(t).(*wire.AuthUpdate); !ok || !slices.Contains(up.AuthorizedPeers, live.Cache.ID) {
		t.Fatalf("update %#v", up)
	}

	// The bare project registers the worker (its project fails: no cache),
	// then subscribes to the cache, which reauths the project's workers.
	api.Must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": live.Bare.ID, "worker_id": id}, &cred)
	live.Remember(cred.Token)
	w.Tokens[live.Bare.ID] = cred.Token
	ch, _ = w.Recv(t).(*wire.AuthChallenge)
	w.Sess.Send(w.Auth.Answer(ch))
	if _, ok := w.Recv(t).(*wire.AuthUpdate); !ok {
		t.Fatal("no AuthUpdate after the bare project's registration")
	}
	if slices.Contains(live.Srv.WorkerStatus(id).Projects, live.Bare.ID) {
		t.Fatal("a project without a cache was granted")
	}
	var res admin.LinkResult
	api.Must(201, "PUT", servertest.ProjectPath(live.Bare.ID)+"/caches/"+live.Cache.Name, nil, &res)
	if res.ReauthorizedSessions != 1 {
		t.Errorf("subscribe reauthorized %d sessions", res.ReauthorizedSessions)
	}
	ch, _ = w.Recv(t).(*wire.AuthChallenge)
	w.Sess.Send(w.Auth.Answer(ch))
	if _, ok := w.Recv(t).(*wire.AuthUpdate); !ok {
		t.Fatal("no AuthUpdate after the subscription")
	}
	var workers []admin.ProjectWorker
	api.Must(200, "GET", servertest.ProjectPath(live.Bare.ID)+"/workers", nil, &workers)
	if len(workers) != 1 || !workers[0].Live {
		t.Errorf("bare project's workers %+v", workers)
	}
	var shown admin.WorkerView
	api.Must(200, "GET", "/api/v1/workers/"+id, nil, &shown)
	if !shown.Live || len(shown.Registrations) != 3 {
		t.Errorf("worker %+v", shown)
	}
	var state admin.ServerView
	api.Must(200, "GET", "/api/v1/server", nil, &state)
	if state.ConnectedWorkers != 1 {
		t.Errorf("server %+v", state)
	}

	// A grant reauths the team's live team workers.
	var tcred admin.NewCredential
	api.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "builders"}, nil)
	api.Must(201, "POST", "/api/v1/teams/builders/workers", map[string]any{}, &tcred)
	live.Remember(tcred.Token)
	api.Must(201, "PUT", servertest.ProjectPath("ops/web")+"/teams/builders", nil, nil)
	tw := live.MustConnect(tcred.WorkerID, map[string]string{tcred.PeerID: tcred.Token})
	api.Must(201, "PUT", servertest.ProjectPath("ops/bare")+"/teams/builders", nil, &res)
	if res.ReauthorizedSessions != 1 {
		t.Errorf("grant reauthorized %d sessions", res.ReauthorizedSessions)
	}
	ch, _ = tw.Recv(t).(*wire.AuthChallenge)
	tw.Sess.Send(tw.Auth.Answer(ch))
	if _, ok := tw.Recv(t).(*wire.AuthUpdate); !ok {
		t.Fatal("no AuthUpdate after the grant")
	}
	waitfor.True(t, "the team worker to join ops/bare", func() bool {
		return slices.Contains(live.Srv.WorkerStatus(tcred.WorkerID).Projects, live.Bare.ID)
	})
	live.AssertNotLogged(t, live.Logs.String())
}
