package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/clitest"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/proxy/admin/admintest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/workersession"
)

// proxyEnv is what the proxy commands see: the proxy and its token.
func proxyEnv(p *admintest.Proxy) map[string]string {
	return map[string]string{"GRADIENT_PROXY_URL": p.URL, "GRADIENT_PROXY_ADMIN_TOKEN": p.Token}
}

// The operator's walk-through against a real proxy (real store, both
// legs) and a tenant's real server: tenant, link from a peers file,
// the upstream session live, a worker created, connected, listed live
// and revoked, and the tenant deleted. No output holds a link token.
func TestProxyCommandsEndToEnd(t *testing.T) {
	t.Parallel()
	p := admintest.Start(t, t.TempDir(), admintest.Options{})
	ten := admintest.TenantServer(t, t.TempDir())
	_, linkToken, _ := strings.Cut(ten.Peers, ":")
	env := proxyEnv(p)
	run := func(args ...string) string {
		t.Helper()
		code, out, errOut := gradientEnv(t, env, append([]string{"proxy"}, args...)...)
		if code != exitOK {
			t.Fatalf("gradient proxy %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
		if strings.Contains(out, linkToken) || strings.Contains(errOut, linkToken) {
			t.Fatalf("gradient proxy %s printed the link token", strings.Join(args, " "))
		}
		return out
	}
	fails := func(code int, fragment string, args ...string) {
		t.Helper()
		got, out, errOut := gradientEnv(t, env, append([]string{"proxy"}, args...)...)
		if got != code || out != "" || !strings.Contains(errOut, fragment) {
			t.Fatalf("gradient proxy %s: exit %d, stdout %q, stderr %q; want %d and %q", strings.Join(args, " "), got, out, errOut, code, fragment)
		}
	}

	mustContain(t, run("tenant", "create", "acme"), "Created tenant acme")
	fails(exitFail, `tenant "acme" already exists`, "tenant", "create", "acme")
	mustContain(t, run("tenant", "list"), "NAME", "acme", "yes")
	mustContain(t, run("tenant", "show", "acme"), "link:", "none")
	fails(exitFail, `tenant "nope"`, "tenant", "show", "nope")

	peersFile := filepath.Join(t.TempDir(), "acme.peers")
	if err := os.WriteFile(peersFile, []byte("# from acme\n"+ten.Peers+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fails(exitUsage, "[--peers-file] required", "link", "set", "acme", "--url", ten.ProtoURL, "--worker-id", ten.WorkerID)
	fails(exitFail, "want ws:// or wss://", "link", "set", "acme", "--url", "https://ci.example/proto", "--worker-id", ten.WorkerID, "--peers-file", peersFile)
	out := run("link", "set", "acme", "--url", ten.ProtoURL, "--worker-id", ten.WorkerID, "--peers-file", peersFile)
	mustContain(t, out, "Link of acme set.", ten.ProtoURL, ten.WorkerID, ten.ProjectID, "state:", "ok")
	waitfor.True(t, "link status live", func() bool { return strings.Contains(run("link", "status", "acme"), "live since") })
	mustContain(t, run("tenant", "show", "acme"), "url", ten.ProtoURL, "live since")

	var created struct {
		ID, Token string
	}
	out = run("worker", "create", "acme", "--name", "w1", "--capabilities", "build, fetch", "--json")
	if err := json.Unmarshal([]byte(out), &created); err != nil || created.ID == "" || created.Token == "" {
		t.Fatalf("worker create --json: %v %q", err, out)
	}
	out = run("worker", "create", "acme", "--name", "w2")
	mustContain(t, out, "Created worker w2 of tenant acme", "fetch,eval,build", "shown only now")
	if !regexp.MustCompile(`(?m)^  [0-9a-f-]{36}:\S+$`).MatchString(out) {
		t.Fatalf("worker create prints no peers line ID:TOKEN:\n%s", out)
	}
	fails(exitFail, "federate is never granted", "worker", "create", "acme", "--name", "w3", "--capabilities", "federate")
	fails(exitUsage, "--name is required", "worker", "create", "acme")

	testworld.RunWorker(t, worker.Config{
		Session: workersession.Config{
			ServerURL: p.ProtoURL, WorkerID: created.ID, Peers: created.ID + ":" + created.Token,
			Capabilities:   wire.GradientCapabilities{Fetch: true, Eval: true, Build: true},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: time.Hour,
		},
		Architectures: []string{"x86_64-linux"},
	})
	waitfor.True(t, "w1 live in worker list", func() bool {
		return regexp.MustCompile(created.ID + `\s+w1\s+acme\s+fetch,build\s+live`).MatchString(run("worker", "list", "--tenant", "acme"))
	})
	mustContain(t, run("worker", "list"), "w2", "offline")
	out = run("sessions")
	mustContain(t, out, "Upstream", "acme", ten.ProtoURL, "live", "Downstream", created.ID, "w1")
	if strings.Contains(out, created.Token) {
		t.Fatal("sessions printed a worker's token")
	}

	mustContain(t, run("worker", "revoke", created.ID), "Revoked worker "+created.ID)
	waitfor.True(t, "the revoked worker's session closed", func() bool { return !p.Leg.WorkerStatus(created.ID).Live })
	fails(exitFail, "not found", "worker", "revoke", created.ID)

	mustContain(t, run("tenant", "may-run", "acme", "off"), "may not run")
	fails(exitUsage, `want on or off, not "maybe"`, "tenant", "may-run", "acme", "maybe")
	waitfor.True(t, "no session while the tenant may not run", func() bool {
		return strings.Contains(run("link", "status", "acme"), "the tenant may not run")
	})
	mustContain(t, run("tenant", "may-run", "acme", "on"), "may run")
	mustContain(t, run("link", "disable", "acme"), "Link of acme disabled.", "enabled:", "no")
	mustContain(t, run("link", "enable", "acme"), "Link of acme enabled.")

	// A token the tenant's server rejects: status shows failing, the
	// server's reason and since when, until the link is set again.
	run("link", "disable", "acme")
	waitfor.True(t, "no session while disabled", func() bool { return strings.Contains(run("link", "status", "acme"), "disabled") })
	wrongFile := filepath.Join(t.TempDir(), "wrong.peers")
	if err := os.WriteFile(wrongFile, []byte(ten.ProjectID+":"+strings.Repeat("x", len(linkToken))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run("link", "set", "acme", "--url", ten.ProtoURL, "--worker-id", ten.WorkerID, "--peers-file", wrongFile)
	run("link", "enable", "acme")
	// The state turns failing a moment before the rejected session ends
	// (its line says "connecting" until then).
	waitfor.True(t, "link status failing, its session ended", func() bool {
		return strings.Contains(run("link", "status", "acme"), "failing: set it again")
	})
	out = run("link", "status", "acme")
	mustContain(t, out, "state:", "failing", "reason:", "401", "failing: set it again")
	if regexp.MustCompile(`(?m)^since:\s+-$`).MatchString(out) {
		t.Fatalf("a failing link's status without its time:\n%s", out)
	}
	run("link", "set", "acme", "--url", ten.ProtoURL, "--worker-id", ten.WorkerID, "--peers-file", peersFile)
	waitfor.True(t, "link status live again", func() bool { return strings.Contains(run("link", "status", "acme"), "live since") })

	mustContain(t, run("tenant", "delete", "acme"), "Deleted tenant acme")
	fails(exitFail, "not found", "link", "status", "acme")
	if strings.Contains(p.Logs.String(), linkToken) {
		t.Fatal("the link token reached the proxy's log")
	}
}

// --json prints the proxy's own answer.
func TestProxyJSONOutput(t *testing.T) {
	t.Parallel()
	p := admintest.Start(t, t.TempDir(), admintest.Options{})
	code, out, errOut := gradientEnv(t, proxyEnv(p), "proxy", "tenant", "create", "acme", "--json")
	var tenant struct {
		ID, Name string
		MayRun   bool `json:"may_run"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &tenant) != nil || tenant.Name != "acme" || !tenant.MayRun {
		t.Fatalf("tenant create --json: %d %q %q", code, out, errOut)
	}
	code, out, _ = gradientEnv(t, proxyEnv(p), "--json", "proxy", "sessions")
	var s struct{ Upstream, Downstream []any }
	if code != exitOK || json.Unmarshal([]byte(out), &s) != nil || s.Upstream == nil || s.Downstream == nil {
		t.Fatalf("sessions --json: %d %q", code, out)
	}
	code, out, _ = gradientEnv(t, proxyEnv(p), "proxy", "tenant", "delete", "acme", "--json")
	if code != exitOK || !strings.Contains(out, `"ok":true`) {
		t.Fatalf("tenant delete --json: %d %q", code, out)
	}
}

// The proxy's URL and token come from --proxy, --proxy-token and
// --proxy-token-file or their variables; the server's settings are not
// sent to the proxy.
func TestProxyConnectionSettings(t *testing.T) {
	t.Parallel()
	p := admintest.Start(t, t.TempDir(), admintest.Options{})
	noEnv := map[string]string{}
	if code, out, errOut := gradientEnv(t, noEnv, "proxy", "--proxy", p.URL, "--proxy-token", p.Token, "tenant", "list"); code != exitOK || !strings.Contains(out, "NAME") {
		t.Fatalf("leading flags: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := gradientEnv(t, noEnv, "proxy", "tenant", "list", "--proxy", p.URL, "--proxy-token", p.Token); code != exitOK {
		t.Fatalf("trailing flags: %d %q", code, errOut)
	}
	file := filepath.Join(t.TempDir(), "token")
	os.WriteFile(file, []byte(p.Token+"\n"), 0o600)
	if code, _, errOut := gradientEnv(t, map[string]string{"GRADIENT_PROXY_URL": p.URL, "GRADIENT_PROXY_ADMIN_TOKEN_FILE": file}, "proxy", "sessions"); code != exitOK {
		t.Fatalf("env token file: %d %q", code, errOut)
	}
	if code, _, errOut := gradientEnv(t, map[string]string{"GRADIENT_PROXY_URL": p.URL, "GRADIENT_PROXY_ADMIN_TOKEN": "wrong"}, "proxy", "sessions", "--proxy-token-file", file); code != exitOK {
		t.Fatalf("flag token file over a wrong env token: %d %q", code, errOut)
	}
	code, _, errOut := gradientEnv(t, map[string]string{"GRADIENT_PROXY_URL": p.URL, "GRADIENT_PROXY_ADMIN_TOKEN": "wrong"}, "proxy", "sessions")
	if code != exitFail || !strings.Contains(errOut, "wrong admin token") {
		t.Fatalf("wrong token: %d %q", code, errOut)
	}
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		// The server's token is never sent to the proxy.
		{map[string]string{"GRADIENT_PROXY_URL": p.URL, "GRADIENT_ADMIN_TOKEN": p.Token}, []string{"proxy", "tenant", "list"}, "no admin token: pass --proxy-token"},
		{proxyEnv(p), []string{"--token", "x", "proxy", "tenant", "list"}, "--token names gradient-server"},
		{proxyEnv(p), []string{"proxy", "tenant", "list", "--server", p.URL}, "--server names gradient-server"},
		{noEnv, []string{"proxy", "tenant", "list", "--proxy-token", "a", "--proxy-token-file", file}, "not both"},
		{map[string]string{"GRADIENT_PROXY_ADMIN_TOKEN": "a", "GRADIENT_PROXY_ADMIN_TOKEN_FILE": file}, []string{"proxy", "sessions"}, "set GRADIENT_PROXY_ADMIN_TOKEN or GRADIENT_PROXY_ADMIN_TOKEN_FILE, not both"},
		{proxyEnv(p), []string{"proxy", "tenant", "create"}, "want NAME"},
		{proxyEnv(p), []string{"proxy", "link", "frobnicate"}, "unknown command"},
		{proxyEnv(p), []string{"proxy"}, "missing subcommand"},
		{proxyEnv(p), []string{"proxy", "link", "set", "acme", "--url", "ws://x/proto", "--worker-id", "x", "--peers-file", "/nonexistent"}, "--peers-file"},
	} {
		code, _, errOut := gradientEnv(t, c.env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, errOut, c.want)
		}
	}
	code, _, errOut = gradientEnv(t, map[string]string{"GRADIENT_PROXY_URL": "http://127.0.0.1:1", "GRADIENT_PROXY_ADMIN_TOKEN": "x"}, "proxy", "sessions")
	if code != exitFail || !strings.Contains(errOut, "cannot reach the proxy") {
		t.Errorf("unreachable: %d %q", code, errOut)
	}
}

// Every proxy flag with a variable shows it in -h, the group's help
// explains the connection and a deployment, and help hides the server's
// settings.
func TestProxyHelp(t *testing.T) {
	code, out, _ := gradientEnv(t, nil, "proxy", "-h")
	if code != exitOK {
		t.Fatalf("proxy -h: exit %d", code)
	}
	mustContain(t, out, "[$GRADIENT_PROXY_URL]", "[$GRADIENT_PROXY_ADMIN_TOKEN]", "[$GRADIENT_PROXY_ADMIN_TOKEN_FILE]",
		"gradient worker register --project", "gradient proxy link set", "--peers-file", "proxy worker create TENANT", "proxy sessions")
	code, leaf, _ := gradientEnv(t, nil, "proxy", "tenant", "list", "-h")
	if code != exitOK {
		t.Fatalf("proxy tenant list -h: exit %d", code)
	}
	a := &app{ctx: context.Background(), getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard}
	root := a.rootCommand()
	var proxy = root.Command("proxy")
	clitest.HelpListsEveryVariable(t, proxy, leaf)
	if strings.Contains(leaf, "--server") || strings.Contains(leaf, "$GRADIENT_ADMIN_TOKEN") {
		t.Errorf("proxy help shows the server's settings:\n%s", leaf)
	}
}
