package server

import (
	"testing"

	"gradient.dev/gradient/server/admin"
)

// Scoped tokens: a read token may GET and nothing else, an admin token
// may do what the admin token does, a revoked one nothing; the secret is
// shown once and never listed.
func TestAdminScopedTokens(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	_, p, _ := e.seed()
	var read, adm admin.TokenView
	e.must(201, "POST", "/api/v1/tokens", map[string]any{"name": "reader", "scope": "read"}, &read)
	e.must(201, "POST", "/api/v1/tokens", map[string]any{"name": "ops", "scope": "admin"}, &adm)
	e.remember(read.Token)
	e.remember(adm.Token)
	e.fails(400, "scope", "POST", "/api/v1/tokens", map[string]any{"name": "x", "scope": "root"})
	var list []admin.TokenView
	e.must(200, "GET", "/api/v1/tokens", nil, &list)
	if len(list) != 2 || list[0].Token != "" || list[1].Token != "" {
		t.Fatalf("token list %+v: want two, without secrets", list)
	}

	e.token = read.Token
	e.must(200, "GET", "/api/v1/teams", nil, nil)
	e.fails(403, "only read", "POST", "/api/v1/teams", map[string]any{"name": "nope"})
	e.fails(403, "only read", "PUT", projectPath(p.ID)+"/public", nil)

	e.token = adm.Token
	var pub admin.PublicView
	e.must(200, "PUT", projectPath(p.ID)+"/public", nil, &pub)
	if !pub.Public {
		t.Fatalf("public %+v", pub)
	}
	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "made-by-token"}, nil)
	e.must(204, "DELETE", "/api/v1/tokens/"+read.ID, nil, nil)

	e.token = read.Token
	e.fails(401, "wrong or revoked API token", "GET", "/api/v1/teams", nil)
	e.token = testAdminToken
	e.must(200, "DELETE", projectPath(p.ID)+"/public", nil, &pub)
	if pub.Public {
		t.Fatalf("public %+v after DELETE", pub)
	}
}
