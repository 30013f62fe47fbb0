package admin_test

import (
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
)

// A project's repository and branch are checked when the project is
// created: what git must not be given is a 400 with the reason, not a
// warning at every poll.
func TestAdminProjectSourcesAreChecked(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
	create := func(repository, branch string) map[string]any {
		return map[string]any{"team": "ops", "name": "p", "repository": repository, "branch": branch}
	}
	for _, tc := range []struct{ repository, branch, reason string }{
		{"--upload-pack=touch /tmp/x;false", "main", "repository: invalid git source: repository URL \"--upload-pack=touch /tmp/x;false\" starts with '-'"},
		{"-oProxyCommand=x", "main", "starts with '-'"},
		{"ext::sh -c touch% /tmp/x", "main", "space or control character"},
		{"fd::0", "main", "remote helper"},
		{"file:///srv/git/r", "main", "local repositories are not allowed"},
		{"/srv/git/r", "main", "local repositories are not allowed"},
		{"https://example.invalid/r\nX-Injected: 1", "main", "control character"},
		{"https://example.invalid/" + strings.Repeat("r", 10<<10), "main", "longer than"},
		{"http://example.invalid/r", "main", `scheme "http" is not allowed`},
		{"https://example.invalid/r", "--upload-pack=x", "branch: invalid git source: branch \"--upload-pack=x\": starts with '-'"},
		{"https://example.invalid/r", "main\nX", `contains '\n'`},
		{"https://example.invalid/r", "a..b", `contains ".."`},
		{"https://example.invalid/r", "feature/", "ends with '/'"},
		{"https://example.invalid/r", strings.Repeat("b", 10<<10), "longer than"},
	} {
		e.Fails(400, tc.reason, "POST", "/api/v1/projects", create(tc.repository, tc.branch))
	}
	var p admin.ProjectView
	for _, ok := range []string{"git@github.com:o/r.git", "ssh://git@example.invalid/r", "git+https://example.invalid/r", "git://example.invalid/r"} {
		e.Must(201, "POST", "/api/v1/projects", create(ok, "release/1.x"), &p)
		e.Must(204, "DELETE", servertest.ProjectPath(p.ID), nil, nil)
	}

	// The operator may allow local repositories.
	local := servertest.NewAdminEnvWith(t, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken), AllowLocalRepositories: true})
	local.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
	local.Must(201, "POST", "/api/v1/projects", create("/srv/git/r", "main"), nil)
	local.Fails(400, "starts with '-'", "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "q", "repository": "--upload-pack=x"})
}

// A project stored before the API checked sources: eval start refuses
// it (its job would reach the workers), with or without a commit.
func TestAdminEvaluationRefusesStoredBadRepository(t *testing.T) {
	t.Parallel()
	e, fake := servertest.NewEvalEnv(t, server.Config{})
	servertest.NewProjectAt(t, e.DB, "ops", "old", "fd::0", "main")
	servertest.NewProjectAt(t, e.DB, "ops", "local", "/srv/git/r", "main")
	for _, body := range []any{nil, map[string]any{"commit": strings.Repeat("a", 40)}} {
		e.Fails(400, "remote helper", "POST", servertest.ProjectPath("ops/old")+"/evaluations", body)
		e.Fails(400, "local repositories are not allowed", "POST", servertest.ProjectPath("ops/local")+"/evaluations", body)
	}
	if n := fake.StartedCount(); n != 0 {
		t.Fatalf("%d evaluations started, want none", n)
	}
}
