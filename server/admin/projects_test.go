package admin_test

import (
	"database/sql"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/servertest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

func TestAdminProjectWildcards(t *testing.T) {
	t.Parallel()
	e, fake := servertest.NewEvalEnv(t, server.Config{})
	e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
	create := func(name string, wildcards any) map[string]any {
		body := map[string]any{"team": "ops", "name": name, "repository": "https://example.invalid/" + name + ".git"}
		if wildcards != nil {
			body["wildcards"] = wildcards
		}
		return body
	}

	var plain, checked admin.ProjectView
	e.Must(201, "POST", "/api/v1/projects", create("plain", nil), &plain)
	if !slices.Equal(plain.Wildcards, []string{"packages.x86_64-linux.*"}) {
		t.Errorf("created without wildcards: %q, want the default", plain.Wildcards)
	}
	// Comma-separated, spaces around the commas trimmed, one pattern per element.
	e.Must(201, "POST", "/api/v1/projects", create("checked", []string{" packages.*.*,checks.x86_64-linux.* ", "!packages.x86_64-linux.slow"}), &checked)
	want := []string{"packages.*.*", "checks.x86_64-linux.*", "!packages.x86_64-linux.slow"}
	if !slices.Equal(checked.Wildcards, want) {
		t.Fatalf("created with wildcards: %q, want %q", checked.Wildcards, want)
	}
	var shown admin.ProjectView
	e.Must(200, "GET", servertest.ProjectPath("ops/checked"), nil, &shown)
	var listed []admin.ProjectView
	e.Must(200, "GET", "/api/v1/projects?team=ops", nil, &listed)
	if !slices.Equal(shown.Wildcards, want) || len(listed) != 2 || !slices.Equal(listed[0].Wildcards, want) {
		t.Fatalf("show %q, list %+v", shown.Wildcards, listed)
	}

	tooMany := make([]string, admin.MaxWildcards+1)
	for i := range tooMany {
		tooMany[i] = "packages.x86_64-linux.*"
	}
	for _, bad := range []struct {
		wildcards any
		reason    string
	}{
		{[]string{}, "no pattern to evaluate"},
		{[]string{"!packages.x86_64-linux.slow"}, "no pattern to evaluate"},
		{[]string{""}, "empty pattern"},
		{[]string{"packages.*, , checks.*"}, "empty pattern"},
		{[]string{"packages.*.*,"}, "empty pattern"},
		{[]string{"foo.*"}, "must start with one of"},
		{[]string{"packages..x"}, "empty segment"},
		{[]string{`packages."a.b`}, "unterminated quote"},
		{[]string{"!packages.*"}, "may not contain wildcards"},
		{tooMany, "at most 64"},
		{[]string{"packages." + strings.Repeat("x", admin.MaxWildcardLength)}, "longer than 256 bytes"},
		{"packages.*.*", "not valid JSON"},
	} {
		e.Fails(400, bad.reason, "POST", "/api/v1/projects", create("bad", bad.wildcards))
		e.Fails(400, bad.reason, "PATCH", servertest.ProjectPath("ops/checked"), map[string]any{"wildcards": bad.wildcards})
	}
	e.Fails(404, "does not exist", "GET", servertest.ProjectPath("ops/bad"), nil)
	e.Fails(400, "nothing to update", "PATCH", servertest.ProjectPath("ops/checked"), map[string]any{})
	e.Fails(400, "unknown field", "PATCH", servertest.ProjectPath("ops/checked"), map[string]any{"branch": "x"})
	e.Fails(404, "does not exist", "PATCH", servertest.ProjectPath("ops/nope"), map[string]any{"wildcards": []string{"checks.*"}})
	e.Must(200, "GET", servertest.ProjectPath("ops/checked"), nil, &shown)
	if !slices.Equal(shown.Wildcards, want) {
		t.Fatalf("refused updates changed the wildcards to %q", shown.Wildcards)
	}

	// Evaluations take the project's wildcards of when they are queued.
	commit := strings.Repeat("a", 40)
	var first, second admin.EvaluationView
	e.Must(201, "POST", servertest.ProjectPath("ops/checked")+"/evaluations", map[string]any{"commit": commit}, &first)
	var updated admin.ProjectView
	e.Must(200, "PATCH", servertest.ProjectPath("ops/checked"), map[string]any{"wildcards": []string{"hydraJobs.*, checks.aarch64-linux.lint"}}, &updated)
	later := []string{"hydraJobs.*", "checks.aarch64-linux.lint"}
	if !slices.Equal(updated.Wildcards, later) || updated.Team != "ops" || updated.ID != checked.ID {
		t.Fatalf("updated %+v", updated)
	}
	e.Must(201, "POST", servertest.ProjectPath("ops/checked")+"/evaluations", map[string]any{"commit": commit}, &second)
	if !slices.Equal(first.Wildcards, want) || !slices.Equal(second.Wildcards, later) {
		t.Fatalf("evaluations' wildcards %q then %q, want %q then %q", first.Wildcards, second.Wildcards, want, later)
	}
	e.Must(200, "GET", "/api/v1/evaluations/"+first.ID, nil, &first)
	if !slices.Equal(first.Wildcards, want) {
		t.Fatalf("the update changed a queued evaluation's wildcards to %q", first.Wildcards)
	}
	started := fake.Started()
	if len(started) != 2 || !slices.Equal(started[1].Wildcards, later) {
		t.Fatalf("the job loop was asked for %+v", started)
	}
	if !strings.Contains(e.Logs.String(), "admin: project updated") {
		t.Error("no log line for the update")
	}
}

// A database error while listing a team's projects answers 500, not 200
// with an empty list (issue 26: the listing once dropped that error).
func TestAdminTeamProjectsDatabaseError(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, engine, dbURL string) {
		db, err := storage.Open(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		srv := server.New(db, server.Config{AdminTokenHash: servertest.SHA256Hex(servertest.AdminToken), Logger: slog.New(slog.DiscardHandler)})
		hs := httptest.NewServer(srv.Handler())
		t.Cleanup(func() { hs.Close(); srv.Close(); db.Close() })
		e := &servertest.Admin{T: t, Base: hs.URL, Token: servertest.AdminToken}

		e.Must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
		e.Must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://example.invalid/web.git"}, nil)
		var listed []admin.ProjectView
		e.Must(200, "GET", "/api/v1/projects?team=ops", nil, &listed)
		if len(listed) != 1 {
			t.Fatalf("listed %+v, want ops/web", listed)
		}

		// The projects table goes away behind the server's back; teams stay.
		driver, dsn := "pgx", dbURL
		if engine == "sqlite" {
			driver, dsn = "sqlite", strings.TrimPrefix(dbURL, "sqlite://")+"?_pragma=busy_timeout(10000)"
		}
		raw, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		if _, err := raw.ExecContext(t.Context(), `ALTER TABLE projects RENAME TO projects_gone`); err != nil {
			t.Fatal(err)
		}
		status, body := e.Call("GET", "/api/v1/projects?team=ops", nil)
		if status != 500 || !strings.Contains(string(body), "internal error") {
			t.Fatalf("listing ops's projects without a projects table: %d %s, want 500", status, body)
		}
	})
}
