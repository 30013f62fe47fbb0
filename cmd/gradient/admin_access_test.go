package main

import (
	"regexp"
	"strings"
	"testing"
)

// gradient token create|list|revoke, project public and eval
// restart-failed against the real admin API.
func TestAccessCommands(t *testing.T) {
	s := newAdminServer(t)
	s.ok(t, "team", "create", "ops")
	s.ok(t, "project", "create", "ops/web", "--repository", "https://example.invalid/web.git")

	out := s.ok(t, "token", "create", "ci", "--scope", "read")
	m := regexp.MustCompile(`(?m)^(gradt_\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no token printed:\n%s", out)
	}
	list := s.ok(t, "token", "list")
	mustContain(t, list, "ci", "read")
	if strings.Contains(list, m[1]) {
		t.Fatal("token list shows the secret")
	}
	// The read token reads through the CLI and may not change anything.
	reader := map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN": m[1]}
	if code, out, errOut := gradientEnv(t, reader, "project", "list"); code != exitOK || !strings.Contains(out, "web") {
		t.Fatalf("read token listing projects: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := gradientEnv(t, reader, "team", "create", "nope"); code == exitOK || !strings.Contains(errOut, "may only read") {
		t.Fatalf("read token creating a team: %d %q", code, errOut)
	}

	mustContain(t, s.ok(t, "project", "public", "ops/web"), "public")
	mustContain(t, s.ok(t, "project", "public", "ops/web", "--off"), "private")
	s.fails(t, exitFail, "evaluation", "eval", "restart-failed", "00000000-0000-0000-0000-000000000000")

	id := regexp.MustCompile(`id ([0-9a-f-]{36})`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no token ID printed:\n%s", out)
	}
	mustContain(t, s.ok(t, "token", "revoke", id[1]), "revoked")
	if code, _, errOut := gradientEnv(t, reader, "project", "list"); code == exitOK || !strings.Contains(errOut, "revoked") {
		t.Fatalf("revoked token: %d %q", code, errOut)
	}
}
