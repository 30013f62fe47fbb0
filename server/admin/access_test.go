package admin_test

import (
	"testing"

	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
)

// Scoped tokens: a read token may GET and nothing else, an admin token
// may do what the admin token does, a revoked one nothing; the secret is
// shown once and never listed.
func TestAdminScopedTokens(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	_, p, _ := e.Seed()
	var read, adm admin.TokenView
	e.Must(201, "POST", "/api/v1/tokens", map[string]any{"name": "reader", "scope": "read"}, &read)
	e.Must(201, "POST", "/api/v1/tokens", map[string]any{"name": "ops", "scope": "admin"}, &adm)
	e.Remember(read.Token)
	e.Remember(adm.Token)
	e.Fails(400, "scope", "POST", "/api/v1/tokens", map[string]any{"name": "x", "scope": "root"})
	var list []admin.TokenView
	e.Must(200, "GET", "/api/v1/tokens", nil, &list)
	if len(list) != 2 || list[0].Token != "" || list[1].Token != "" {
		t.Fatalf("token list %+v: want two, without secrets", list)
	}

	e.Token = read.Token
	e.Must(200, "GET", "/api/v1/teams", nil, nil)
	e.Fails(403, "only read", "POST", "/api/v1/teams", map[string]any{"name": "nope"})
	e.Fails(403, "only read", "PUT", servertest.ProjectPath(p.ID)+"/public", nil)

	e.Token = adm.Token
	var pub admin.PublicView
	e.Must(200, "PUT", servertest.ProjectPath(p.ID)+"/public", nil, &pub)
	if !pub.Public {
		t.Fatalf("public %+v", pub)
	}
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "made-by-token"}, nil)
	e.Must(204, "DELETE", "/api/v1/tokens/"+read.ID, nil, nil)

	e.Token = read.Token
	e.Fails(401, "wrong or revoked API token", "GET", "/api/v1/teams", nil)
	e.Token = servertest.AdminToken
	e.Must(200, "DELETE", servertest.ProjectPath(p.ID)+"/public", nil, &pub)
	if pub.Public {
		t.Fatalf("public %+v after DELETE", pub)
	}
}
