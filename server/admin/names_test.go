package admin_test

import (
	"strings"
	"testing"

	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
)

// The API takes a name or an ID in the same place, so a name that reads
// as a UUID is refused: a team named with another team's ID would be
// unreachable by its name (and a cache likewise).
func TestAdminNamesThatReadAsUUIDs(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	ops, _, main := e.Seed()
	e.Fails(400, "reads as a UUID", "POST", "/api/v1/teams", map[string]any{"name": ops.ID})
	e.Fails(400, "reads as a UUID", "POST", "/api/v1/teams", map[string]any{"name": strings.ToUpper(storage.NewID())})
	e.Fails(400, "reads as a UUID", "POST", "/api/v1/caches", map[string]any{"name": main.ID})
	e.Fails(400, "reads as a UUID", "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": storage.NewID(), "repository": "https://example.invalid/r"})
	// What the refused names would have shadowed is still found by ID.
	var team admin.TeamView
	e.Must(200, "GET", "/api/v1/teams/"+ops.ID, nil, &team)
	if team.Name != "ops" {
		t.Fatalf("team by ID: %+v", team)
	}
	// A name merely shaped like part of one is fine.
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": ops.ID[:35]}, nil)
}
