package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forge/forgetest"
)

// gradient project forge …: set from a token file (never shown again),
// show, test against a fake forge, a webhook secret printed once with its
// URL, remove.
func TestForgeCommands(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	fake := forgetest.New(t, forge.Gitea, forgetest.Options{})
	s.ok(t, "team", "create", "ops")
	s.ok(t, "project", "create", "ops/web", "--repository", "https://example.invalid/web.git")

	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(fake.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.fails(t, exitUsage, "--forge-token-file, or --app-id", "project", "forge", "set", "ops/web", "--kind", "gitea", "--repository", fake.Repository)
	s.fails(t, exitFail, "loopback", "project", "forge", "set", "ops/web", "--kind", "gitea",
		"--repository", fake.Repository, "--api-url", "http://forge.example.com", "--forge-token-file", tokenFile)
	out := s.ok(t, "project", "forge", "set", "ops/web", "--kind", "forgejo", "--repository", fake.Repository,
		"--api-url", fake.URL(), "--forge-token-file", tokenFile, "--trust", "all")
	mustContain(t, out, "reports to gitea "+fake.Repository, "webhook-secret")
	show := s.ok(t, "project", "forge", "show", "ops/web")
	mustContain(t, show, "trust:", "all", "webhook secret:", "not set", "/api/v1/forge/gitea/ops/web", "status context:", "gradient/web")
	if strings.Contains(show, fake.Token) {
		t.Fatalf("show printed the token:\n%s", show)
	}
	mustContain(t, s.ok(t, "project", "forge", "test", "ops/web"), "works")

	code, secret, hint := gradientEnv(t, s.env(), "project", "forge", "webhook-secret", "ops/web")
	if code != exitOK || len(strings.TrimSpace(secret)) < 32 || strings.Count(secret, "\n") != 1 || !strings.Contains(hint, "/api/v1/forge/gitea/ops/web") {
		t.Fatalf("webhook-secret: exit %d, stdout %q, stderr %q", code, secret, hint)
	}
	show = s.ok(t, "project", "forge", "show", "ops/web")
	if strings.Contains(show, strings.TrimSpace(secret)) {
		t.Fatalf("show printed the webhook secret:\n%s", show)
	}
	mustContain(t, show, "webhook secret:", "set")
	mustContain(t, s.ok(t, "project", "forge", "remove", "ops/web"), "Removed the forge link")
	s.fails(t, exitFail, "forge link", "project", "forge", "show", "ops/web")
}
