package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"
)

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
	repo := servertest.NewGitRepo(t)
	repo.Commit("first")

	e, fake := servertest.NewEvalEnv(t, server.Config{})
	marker := filepath.Join(t.TempDir(), "injected")
	for i, src := range [][2]string{
		{"--upload-pack=touch " + marker + ";false", "main"},
		{"-oProxyCommand=touch " + marker, "main"},
		{"ext::sh -c touch% " + marker, "main"},
		{"fd::0", "main"},
		{"file://" + repo.Dir, "main"},
		{repo.Dir, "main"},
		{"https://127.0.0.1:1/r", "a..b"},
		{"https://127.0.0.1:1/r", "--upload-pack=touch " + marker},
	} {
		servertest.NewProjectAt(t, e.DB, "ops", "bad"+string(rune('a'+i)), src[0], src[1])
	}
	servertest.NewProjectAt(t, e.DB, "ops", "good", "https://127.0.0.1:1/r", "main")

	os.Remove(calls) // the set-up's own git calls
	if started := e.Srv.PollBranches(t.Context()); len(started) != 0 || fake.StartedCount() != 0 {
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
	logs := e.Logs.String()
	for _, reason := range []string{"remote helper", "local repositories are not allowed", `contains \"..\"`} {
		if !strings.Contains(logs, reason) {
			t.Errorf("no warning saying %s:\n%s", reason, logs)
		}
	}
}
