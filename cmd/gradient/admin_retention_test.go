package main

import "testing"

// The retention commands against a real server: settings round-trip and
// a collection (dry and real) reports what it freed.
func TestRetentionCommands(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	s.ok(t, "team", "create", "ops")
	s.ok(t, "project", "create", "ops/web", "--repository", "https://example.invalid/web.git")
	s.ok(t, "cache", "create", "main")

	mustContain(t, s.ok(t, "project", "retention", "ops/web"), "keeps the server's default")
	mustContain(t, s.ok(t, "project", "retention", "ops/web", "--keep-evaluations", "3"), "keeps its newest 3 evaluations")
	mustContain(t, s.ok(t, "project", "retention", "ops/web"), "keeps its newest 3 evaluations")
	s.fails(t, exitFail, "at least 1", "project", "retention", "ops/web", "--keep-evaluations", "0")
	mustContain(t, s.ok(t, "project", "retention", "ops/web", "--default"), "keeps the server's default")

	mustContain(t, s.ok(t, "cache", "retention", "main"), "no size cap")
	mustContain(t, s.ok(t, "cache", "retention", "main", "--max-bytes", "1048576"), "size cap 1048576 bytes")
	mustContain(t, s.ok(t, "cache", "retention", "main", "--no-cap"), "no size cap")

	mustContain(t, s.ok(t, "cache", "gc", "--dry-run"), "Would delete 0 paths and 0 NAR objects")
	mustContain(t, s.ok(t, "cache", "gc"), "Deleted 0 paths and 0 NAR objects", "Kept:")
	s.fails(t, exitFail, "", "eval", "pin", "0190c3a0-0000-7000-8000-000000000000")
}
