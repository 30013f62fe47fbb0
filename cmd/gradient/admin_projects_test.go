package main

import (
	"slices"
	"testing"
)

func TestProjectWildcardsCommands(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	s.ok(t, "team", "create", "ops")

	mustContain(t, s.ok(t, "project", "create", "ops/plain", "--repository", "https://example.invalid/plain.git"),
		"building packages.x86_64-linux.*")
	mustContain(t, s.ok(t, "project", "create", "ops/web", "--repository", "https://example.invalid/web.git",
		"--wildcards", "packages.*.*,checks.x86_64-linux.*"), "building packages.*.*, checks.x86_64-linux.*")
	mustContain(t, s.ok(t, "project", "show", "ops/web"), "wildcards:", "packages.*.*, checks.x86_64-linux.*")
	mustContain(t, s.ok(t, "project", "list"), "WILDCARDS", "packages.*.*, checks.x86_64-linux.*", "packages.x86_64-linux.*")
	s.fails(t, exitFail, "must start with one of", "project", "create", "ops/bad", "--repository", "r", "--wildcards", "nixpkgs.*")

	mustContain(t, s.ok(t, "project", "update", "ops/web", "--wildcards", "hydraJobs.*, !hydraJobs.slow"),
		"Project ops/web builds hydraJobs.*, !hydraJobs.slow from its next evaluation on")
	var p projectInfo
	s.okJSON(t, &p, "project", "show", "ops/web")
	if want := []string{"hydraJobs.*", "!hydraJobs.slow"}; !slices.Equal(p.Wildcards, want) {
		t.Fatalf("after update: %q, want %q", p.Wildcards, want)
	}
	s.fails(t, exitUsage, "--wildcards is required", "project", "update", "ops/web")
	s.fails(t, exitFail, "empty pattern", "project", "update", "ops/web", "--wildcards", "checks.*,")
	s.fails(t, exitFail, "does not exist", "project", "update", "ops/nope", "--wildcards", "checks.*")
	mustContain(t, s.ok(t, "project", "show", "ops/web"), "hydraJobs.*, !hydraJobs.slow")
}
