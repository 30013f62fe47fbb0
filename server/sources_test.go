package server

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/server/admin"
)

// A project's repository and branch are checked when the project is
// created: what git must not be given is a 400 with the reason, not a
// warning at every poll.
func TestAdminProjectSourcesAreChecked(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, sha256Hex(testAdminToken))
	e.must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
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
		e.fails(400, tc.reason, "POST", "/api/v1/projects", create(tc.repository, tc.branch))
	}
	var p admin.ProjectView
	for _, ok := range []string{"git@github.com:o/r.git", "ssh://git@example.invalid/r", "git+https://example.invalid/r", "git://example.invalid/r"} {
		e.must(201, "POST", "/api/v1/projects", create(ok, "release/1.x"), &p)
		e.must(204, "DELETE", projectPath(p.ID), nil, nil)
	}

	// The operator may allow local repositories.
	local := newAdminEnvWith(t, Config{AdminTokenHash: sha256Hex(testAdminToken), AllowLocalRepositories: true})
	local.must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
	local.must(201, "POST", "/api/v1/projects", create("/srv/git/r", "main"), nil)
	local.fails(400, "starts with '-'", "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "q", "repository": "--upload-pack=x"})
}

// A project stored before the API checked sources: eval start refuses
// it (its job would reach the workers), with or without a commit.
func TestAdminEvaluationRefusesStoredBadRepository(t *testing.T) {
	t.Parallel()
	e, fake := newEvalEnv(t, Config{})
	newProjectAt(t, e.db, "ops", "old", "fd::0", "main")
	newProjectAt(t, e.db, "ops", "local", "/srv/git/r", "main")
	for _, body := range []any{nil, map[string]any{"commit": strings.Repeat("a", 40)}} {
		e.fails(400, "remote helper", "POST", projectPath("ops/old")+"/evaluations", body)
		e.fails(400, "local repositories are not allowed", "POST", projectPath("ops/local")+"/evaluations", body)
	}
	if n := fake.startedCount(); n != 0 {
		t.Fatalf("%d evaluations started, want none", n)
	}
}

// A branch poll never hands git a stored repository or branch the rules
// refuse (rows from before the API checked them): the "git" on PATH
// records every call, and sees only the one valid project's.
func TestPollerSkipsStoredBadSources(t *testing.T) {
	realGit, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed")
	}
	bin := t.TempDir()
	calls := filepath.Join(t.TempDir(), "git-calls")
	script := "#!/bin/sh\necho \"$*\" >> '" + calls + "'\nexec '" + realGit + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	repo := newGitRepo(t)
	repo.commit("first")

	e, fake := newEvalEnv(t, Config{})
	marker := filepath.Join(t.TempDir(), "injected")
	for i, src := range [][2]string{
		{"--upload-pack=touch " + marker + ";false", "main"},
		{"-oProxyCommand=touch " + marker, "main"},
		{"ext::sh -c touch% " + marker, "main"},
		{"fd::0", "main"},
		{"file://" + repo.dir, "main"},
		{repo.dir, "main"},
		{"https://127.0.0.1:1/r", "a..b"},
		{"https://127.0.0.1:1/r", "--upload-pack=touch " + marker},
	} {
		newProjectAt(t, e.db, "ops", "bad"+string(rune('a'+i)), src[0], src[1])
	}
	newProjectAt(t, e.db, "ops", "good", "https://127.0.0.1:1/r", "main")

	os.Remove(calls) // the set-up's own git calls
	if started := e.srv.pollBranches(t.Context()); len(started) != 0 || fake.startedCount() != 0 {
		t.Fatalf("started %+v", started)
	}
	got, _ := os.ReadFile(calls)
	if lines := strings.Split(strings.TrimSpace(string(got)), "\n"); len(lines) != 1 ||
		!strings.HasSuffix(lines[0], "ls-remote --end-of-options https://127.0.0.1:1/r refs/heads/main") ||
		!strings.HasPrefix(lines[0], "-c protocol.allow=never ") {
		t.Fatalf("git calls:\n%s\nwant the good project's ls-remote alone", got)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the injected command ran")
	}
	logs := e.logs.String()
	for _, reason := range []string{"remote helper", "local repositories are not allowed", `contains \"..\"`} {
		if !strings.Contains(logs, reason) {
			t.Errorf("no warning saying %s:\n%s", reason, logs)
		}
	}
}
