package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/deploykeys"
	"gradient.dev/gradient/storage"
)

const cliAdminToken = "cli-test-admin-token"

// adminServer is the real admin API on SQLite behind httptest.
type adminServer struct {
	url string
	db  *storage.DB
}

func newAdminServer(t *testing.T) *adminServer {
	t.Helper()
	db, err := storage.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A SHA-256 admin hash (which secret.Verify accepts) keeps each call
	// free of the argon2id cost.
	sum := sha256.Sum256([]byte(cliAdminToken))
	// A dial key lets workers be registered with a URL the server dials.
	key, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(db, server.Config{AdminTokenHash: hex.EncodeToString(sum[:]), DialKey: key,
		DeployKeys: deploykeys.New(db, key), Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
		db.Close()
	})
	return &adminServer{url: hs.URL, db: db}
}

// env is the environment the admin commands see: the server and token.
func (s *adminServer) env() map[string]string {
	return map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN": cliAdminToken}
}

// gradientEnv runs the CLI with env and returns exit code, stdout, stderr.
func gradientEnv(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runWithEnv(args, func(k string) string { return env[k] }, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// ok runs a command that must succeed and returns its stdout.
func (s *adminServer) ok(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := gradientEnv(t, s.env(), args...)
	if code != exitOK {
		t.Fatalf("gradient %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

// fails runs a command that must exit with code and an error on stderr
// containing fragment.
func (s *adminServer) fails(t *testing.T, code int, fragment string, args ...string) {
	t.Helper()
	got, out, errOut := gradientEnv(t, s.env(), args...)
	if got != code || !strings.Contains(errOut, fragment) {
		t.Fatalf("gradient %s: exit %d (want %d), stdout %q, stderr %q (want %q)", strings.Join(args, " "), got, code, out, errOut, fragment)
	}
}

// okJSON runs a command with --json and decodes its output.
func (s *adminServer) okJSON(t *testing.T, out any, args ...string) {
	t.Helper()
	text := s.ok(t, append(args, "--json")...)
	if err := json.Unmarshal([]byte(text), out); err != nil {
		t.Fatalf("gradient %s --json: %v in %q", strings.Join(args, " "), err, text)
	}
}

func mustContain(t *testing.T, text string, fragments ...string) {
	t.Helper()
	for _, f := range fragments {
		if !strings.Contains(text, f) {
			t.Fatalf("output lacks %q:\n%s", f, text)
		}
	}
}

var uuidPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

func TestAdminCommandsEndToEnd(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)

	mustContain(t, s.ok(t, "team", "create", "ops"), "Created team ops")
	s.fails(t, exitFail, `team "ops" already exists`, "team", "create", "ops")
	mustContain(t, s.ok(t, "team", "list"), "TEAM", "ops")
	mustContain(t, s.ok(t, "team", "show", "ops"), "team:", "ops")

	// Flags may follow the positional argument.
	mustContain(t, s.ok(t, "project", "create", "ops/web", "--repository", "https://example.invalid/web.git"), "Created project ops/web")
	s.fails(t, exitUsage, "--repository is required", "project", "create", "ops/api")
	s.fails(t, exitUsage, "want TEAM/NAME", "project", "create", "web", "--repository", "x")
	s.fails(t, exitFail, `team "nope" does not exist`, "project", "create", "nope/web", "--repository", "x")
	mustContain(t, s.ok(t, "project", "list", "--team", "ops"), "ops/web", "https://example.invalid/web.git", "main")

	out := s.ok(t, "cache", "create", "main", "--public")
	mustContain(t, out, "Created cache main", "trusted-public-keys: main:")
	key := s.ok(t, "cache", "public-key", "main")
	if name, _, err := storage.ParsePublicKey(strings.TrimSuffix(key, "\n")); err != nil || name != "main" || strings.Count(key, "\n") != 1 {
		t.Fatalf("public-key printed %q: %v", key, err)
	}
	mustContain(t, s.ok(t, "cache", "show", "main"), "public key: "+strings.TrimSpace(key), "public:     yes")
	mustContain(t, s.ok(t, "cache", "list"), "main", "yes", strings.TrimSpace(key))

	mustContain(t, s.ok(t, "project", "subscribe", "ops/web", "main"), "subscribes to cache main")
	mustContain(t, s.ok(t, "project", "subscribe", "ops/web", "main"), "already subscribes")
	mustContain(t, s.ok(t, "project", "show", "ops/web"), "caches:", "main")

	// A deploy key: the public key alone on stdout, shown by project show.
	code, deployKey, hint := gradientEnv(t, s.env(), "project", "deploy-key", "ops/web")
	if code != exitOK || !strings.HasPrefix(deployKey, "ssh-ed25519 ") || strings.Count(deployKey, "\n") != 1 || !strings.Contains(hint, "deploy key") {
		t.Fatalf("project deploy-key: exit %d, stdout %q, stderr %q", code, deployKey, hint)
	}
	mustContain(t, s.ok(t, "project", "show", "ops/web"), "deploy key:", strings.TrimSpace(deployKey))
	mustContain(t, s.ok(t, "project", "deploy-key", "ops/web", "--delete"), "Deleted the deploy key of project ops/web")
	s.fails(t, exitFail, "deploy key", "project", "deploy-key", "ops/web", "--delete")

	// Registration: the token is printed once, with the peers-file line.
	out = s.ok(t, "worker", "register", "--project", "ops/web", "--no-build")
	mustContain(t, out, "shown only now", "peers file", "fetch,eval")
	worker := uuidPattern.FindString(out)
	reg, err := s.db.RegistrationsOfWorker(t.Context(), worker)
	if err != nil || len(reg) != 1 {
		t.Fatalf("registration of %s: %v %v", worker, reg, err)
	}
	line := regexp.MustCompile(`(?m)^  ([0-9a-f-]{36}):(\S+)$`).FindStringSubmatch(out)
	if line == nil || line[1] != reg[0].Peer.ID || !secret.Verify(reg[0].TokenHash, line[2]) {
		t.Fatalf("no valid peers line in:\n%s", out)
	}
	token := line[2]
	s.fails(t, exitUsage, "exactly one of --project, --cache or --proxy", "worker", "register")
	s.fails(t, exitUsage, "exactly one of", "worker", "register", "--project", "ops/web", "--cache", "main")
	s.fails(t, exitFail, "already registered", "worker", "register", "--project", "ops/web", "--worker-id", worker)

	regs := s.ok(t, "worker", "registrations", "--project", "ops/web")
	mustContain(t, regs, worker, "fetch,eval")
	list := s.ok(t, "worker", "list", "--project", "ops/web")
	mustContain(t, list, "WORKER", "LIVE", "PROJECTS", "CAPABILITIES", "OFFLINE REASON", worker, "no")
	mustContain(t, s.ok(t, "worker", "show", worker), "live:", "REGISTERED BY", "project", "ops/web")
	for _, text := range []string{regs, list} {
		if strings.Contains(text, token) {
			t.Fatal("a list shows the token")
		}
	}

	mustContain(t, s.ok(t, "worker", "deactivate", worker), "deactivated")
	mustContain(t, s.ok(t, "worker", "list", "--project", "ops/web"), "no (deactivated)")
	mustContain(t, s.ok(t, "worker", "activate", worker), "is active")
	s.fails(t, exitFail, "not a UUID", "worker", "activate", "w1")
	s.fails(t, exitUsage, "--project is required", "worker", "list")

	// A cache and a proxy register the same worker.
	// Nothing listens at the URL: the server's dialer just keeps retrying.
	out = s.ok(t, "worker", "register", "--cache", "main", "--worker-id", worker, "--url", "ws://127.0.0.1:1/proto")
	mustContain(t, out, worker, "accepted server tokens file", "ws://127.0.0.1:1/proto")
	mustContain(t, s.ok(t, "worker", "register", "--proxy", storage.NewID(), "--worker-id", worker), worker)
	mustContain(t, s.ok(t, "worker", "unregister", "--cache", "main", worker), "Removed the registration")
	s.fails(t, exitFail, "registration of worker", "worker", "unregister", "--cache", "main", worker)

	// Team workers and grants.
	mustContain(t, s.ok(t, "team", "create", "builders"), "builders")
	out = s.ok(t, "team", "worker", "add", "builders", "--no-eval")
	mustContain(t, out, "shown only now", "fetch,build")
	teamWorker := uuidPattern.FindString(out)
	mustContain(t, s.ok(t, "team", "worker", "list", "builders"), teamWorker, "fetch,build")
	mustContain(t, s.ok(t, "team", "grant", "ops/web", "builders"), "accepts the workers of team builders")
	mustContain(t, s.ok(t, "team", "grant", "ops/web", "builders"), "already grants")
	mustContain(t, s.ok(t, "project", "show", "ops/web"), "granted teams:", "builders")
	mustContain(t, s.ok(t, "worker", "list", "--project", "ops/web"), teamWorker)
	mustContain(t, s.ok(t, "team", "revoke", "ops/web", "builders"), "no longer grants")
	s.fails(t, exitFail, "grant of project", "team", "revoke", "ops/web", "builders")
	s.fails(t, exitFail, `not a worker of team "ops"`, "team", "worker", "remove", "ops", teamWorker)
	mustContain(t, s.ok(t, "team", "worker", "remove", "builders", teamWorker), "Removed worker")

	// Server connection state.
	mustContain(t, s.ok(t, "server", "status"), "accepting:", "yes", "connected workers: 0")
	mustContain(t, s.ok(t, "server", "stop-accepting"), "no (new worker connections are refused")
	mustContain(t, s.ok(t, "server", "status"), "accepting:", "no")
	mustContain(t, s.ok(t, "server", "resume-accepting"), "yes")

	// Tear down in dependency order.
	s.fails(t, exitFail, "still has projects", "team", "delete", "ops")
	mustContain(t, s.ok(t, "project", "unsubscribe", "ops/web", "main"), "no longer subscribes")
	mustContain(t, s.ok(t, "project", "delete", "ops/web"), "Deleted project ops/web")
	s.fails(t, exitFail, `project "web" does not exist in team "ops"`, "project", "show", "ops/web")
	mustContain(t, s.ok(t, "cache", "delete", "main"), "Deleted cache main")
	mustContain(t, s.ok(t, "team", "delete", "ops"), "Deleted team ops")
	s.fails(t, exitFail, `team "ops" does not exist`, "team", "delete", "ops")
}

func TestAdminJSONOutput(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	var team teamInfo
	s.okJSON(t, &team, "team", "create", "ops")
	var teams []teamInfo
	s.okJSON(t, &teams, "team", "list")
	if len(teams) != 1 || teams[0].ID != team.ID {
		t.Fatalf("teams %+v", teams)
	}
	var project projectInfo
	s.okJSON(t, &project, "project", "create", "ops/web", "--repository", "https://x.invalid/r", "--branch", "dev")
	if project.Branch != "dev" || project.Team != "ops" {
		t.Errorf("project %+v", project)
	}
	var cache cacheInfo
	s.okJSON(t, &cache, "cache", "create", "main")
	var key struct {
		PublicKey string `json:"public_key"`
	}
	s.okJSON(t, &key, "cache", "public-key", "main")
	if key.PublicKey == "" || key.PublicKey != cache.PublicKey {
		t.Errorf("public key %q vs %q", key.PublicKey, cache.PublicKey)
	}
	var cred credentialInfo
	s.okJSON(t, &cred, "worker", "register", "--project", project.ID, "--no-fetch")
	if cred.Token == "" || cred.PeersLine != project.ID+":"+cred.Token || cred.Fetch || !cred.Build {
		t.Errorf("credential %+v", cred)
	}
	var workers []projectWorkerInfo
	s.okJSON(t, &workers, "worker", "list", "--project", "ops/web")
	if len(workers) != 1 || workers[0].WorkerID != cred.WorkerID {
		t.Errorf("workers %+v", workers)
	}
	var state serverInfo
	s.okJSON(t, &state, "server", "stop-accepting")
	if state.Accepting {
		t.Error("still accepting")
	}
	var done struct {
		OK      bool   `json:"ok"`
		Message string `json:"message"`
	}
	s.okJSON(t, &done, "worker", "unregister", "--project", "ops/web", cred.WorkerID)
	if !done.OK || !strings.Contains(done.Message, cred.WorkerID) {
		t.Errorf("unregister %+v", done)
	}
	// Errors stay on stderr with exit 1, also with --json.
	s.fails(t, exitFail, `cache "nope" does not exist`, "cache", "show", "nope", "--json")
}

func TestAdminConnectionSettings(t *testing.T) {
	t.Parallel()
	s := newAdminServer(t)
	noEnv := map[string]string{}

	// Settings before the command, and after it.
	if code, out, errOut := gradientEnv(t, noEnv, "--server", s.url, "--token", cliAdminToken, "team", "list"); code != 0 || !strings.Contains(out, "TEAM") {
		t.Fatalf("leading flags: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := gradientEnv(t, noEnv, "team", "list", "--server", s.url, "--token", cliAdminToken); code != 0 {
		t.Fatalf("trailing flags: %d %q", code, errOut)
	}
	// A flag wins over the environment, either way round.
	wrongEnv := map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN": "wrong"}
	if code, _, errOut := gradientEnv(t, wrongEnv, "team", "list", "--token", cliAdminToken); code != 0 {
		t.Fatalf("flag over a wrong env token: %d %q", code, errOut)
	}
	code, _, errOut := gradientEnv(t, s.env(), "team", "list", "--token", "wrong")
	if code != exitFail || !strings.Contains(errOut, "wrong admin token") {
		t.Fatalf("wrong flag token: %d %q", code, errOut)
	}
	// Token files, from the flag or the environment.
	file := filepath.Join(t.TempDir(), "token")
	os.WriteFile(file, []byte(cliAdminToken+"\n"), 0o600)
	if code, _, errOut := gradientEnv(t, map[string]string{"GRADIENT_SERVER": s.url, "GRADIENT_ADMIN_TOKEN_FILE": file}, "server", "status"); code != 0 {
		t.Fatalf("env token file: %d %q", code, errOut)
	}
	if code, _, errOut := gradientEnv(t, map[string]string{"GRADIENT_SERVER": s.url}, "server", "status", "--token-file", file); code != 0 {
		t.Fatalf("flag token file: %d %q", code, errOut)
	}

	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"GRADIENT_SERVER": s.url}, []string{"team", "list"}, "no admin token"},
		{noEnv, []string{"team", "list", "--token", "a", "--token-file", file}, "not both"},
		{map[string]string{"GRADIENT_ADMIN_TOKEN": "a", "GRADIENT_ADMIN_TOKEN_FILE": file}, []string{"team", "list"}, "not both"},
		{s.env(), []string{"team", "list", "extra"}, "want no arguments"},
		{s.env(), []string{"team", "create"}, "want NAME"},
		{s.env(), []string{"team", "frobnicate"}, "unknown command"},
		{s.env(), []string{"team", "list", "--no-such-flag"}, "not defined"},
		{s.env(), []string{"--server", s.url, "wire", "versions"}, "go with an admin command"},
	} {
		code, _, errOut := gradientEnv(t, c.env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, errOut, c.want)
		}
	}
	// An unreachable server is a failure, not a usage error.
	code, _, errOut = gradientEnv(t, map[string]string{"GRADIENT_SERVER": "http://127.0.0.1:1", "GRADIENT_ADMIN_TOKEN": "x"}, "team", "list")
	if code != exitFail || !strings.Contains(errOut, "cannot reach the server") {
		t.Errorf("unreachable: %d %q", code, errOut)
	}
	if strings.Contains(errOut, "x\n") && strings.Contains(errOut, "Bearer") {
		t.Error("the error shows the token")
	}
	// -h on an admin command is help, not an error.
	if code, _, _ := gradientEnv(t, s.env(), "team", "list", "-h"); code != exitOK {
		t.Errorf("-h: exit %d", code)
	}
}
