package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/servicecli"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }

// syncBuffer collects the proxy's log from its goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startProxy runs serve with args until the returned stop; it fails the
// test if serve does not come up.
func startProxy(t *testing.T, args []string, env map[string]string) (base string, logs *syncBuffer, stop func() error) {
	t.Helper()
	opts, err := parseOptions(args, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, opts, servicecli.NewLogger(opts.LogLevel, opts.LogFormat, logs), func(a net.Addr) { addrs <- a })
	}()
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		cancel()
		t.Fatalf("serve ended before listening: %v\n%s", err, logs.String())
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("serve did not start")
	}
	var once sync.Once
	var result error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(30 * time.Second):
				t.Error("serve did not stop")
			}
		})
		return result
	}
	t.Cleanup(func() { stop() })
	return base, logs, stop
}

// The binary's path end to end: a link stored under the key file's key
// brings the proxy live on the tenant's real server, /healthz and
// /metrics answer (with the tenant's series), stopping closes the
// session, and neither the logs nor the database hold the token.
func TestServeHoldsTheTenantsSession(t *testing.T) {
	t.Parallel()
	// The tenant's server, with the proxy's worker ID registered.
	db := testworld.Open(t, storagetest.SQLiteURL(t))
	project, _ := testworld.Project(t, db, "https://example.invalid/demo.git")
	proxyID, peers := testworld.Register(t, db, project.ID)
	_, token, _ := strings.Cut(peers, ":")
	nars, err := narstore.OpenLocal(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(db, server.Config{NarStore: nars, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { srv.Close(); hs.Close() })
	wsURL := "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"

	// The proxy's database, as the admin API will fill it.
	key := sealbox.NewKey()
	keyFile := writeFile(t, "proxy.key", sealbox.EncodeKey(key)+"\n")
	dataDir := t.TempDir()
	box, err := sealbox.New(key)
	if err != nil {
		t.Fatal(err)
	}
	store, err := proxystore.Open(t.Context(), dataDir, box)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := store.CreateTenant(t.Context(), "secret-customer")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetLink(t.Context(), "secret-customer", wsURL, proxyID, []proxystore.PeerToken{{PeerID: project.ID, Token: token}}); err != nil {
		t.Fatal(err)
	}
	downstreamWorker, workerToken, err := store.CreateWorker(t.Context(), "secret-customer", "builder", proxystore.Capabilities{Build: true})
	if err != nil {
		t.Fatal(err)
	}
	store.Close()

	const adminToken = "proxy-serve-test-admin-token"
	adminFile := writeFile(t, "admin", adminToken)
	base, logs, stop := startProxy(t, []string{"--listen", "127.0.0.1:0", "--database", dataDir, "--log-format", "json"},
		map[string]string{"GRADIENT_PROXY_ENCRYPTION_KEY_FILE": keyFile, "GRADIENT_PROXY_ADMIN_TOKEN_FILE": adminFile})

	metrics := func() testworld.Metrics { return testworld.Scrape(t, base+"/metrics") }
	waitfor.Within(t, 15*time.Second, "the proxy live for the project on the tenant's server", func() bool {
		st := srv.WorkerStatus(proxyID)
		return st.Live && slices.Equal(st.Projects, []string{project.ID})
	})
	waitfor.Within(t, 15*time.Second, "the tenant's session in the proxy's metrics", func() bool {
		return metrics().Value("gradient_worker_connected", map[string]string{"tenant": tenant.ID}) == 1
	})
	// The proxy's own worker connects to its /proto as gradient-worker
	// would, with WORKER_ID:TOKEN as its peers.
	testworld.RunWorker(t, worker.Config{
		Session: workersession.Config{
			ServerURL: "ws" + strings.TrimPrefix(base, "http") + "/proto",
			WorkerID:  downstreamWorker.ID, Peers: downstreamWorker.ID + ":" + workerToken, Capabilities: wire.GradientCapabilities{Build: true},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		},
		CPUCoreScore: 100,
	})
	waitfor.Within(t, 15*time.Second, "the downstream worker's session in the proxy's metrics", func() bool {
		return metrics().Value("gradient_proxy_downstream_workers_connected", nil) == 1
	})
	// The admin API, with the token from the file: both legs' sessions,
	// and never the upstream token.
	adminGet := func(path, token string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, _ := adminGet("/api/v1/sessions", ""); status != http.StatusUnauthorized {
		t.Fatalf("/api/v1/sessions without the token: %d", status)
	}
	var sessions struct {
		Upstream []struct {
			Tenant string `json:"tenant"`
			Live   bool   `json:"live"`
		} `json:"upstream"`
		Downstream []struct {
			WorkerID string `json:"worker_id"`
		} `json:"downstream"`
	}
	status, sessionsBody := adminGet("/api/v1/sessions", adminToken)
	if status != http.StatusOK || json.Unmarshal([]byte(sessionsBody), &sessions) != nil || len(sessions.Upstream) != 1 || !sessions.Upstream[0].Live ||
		len(sessions.Downstream) != 1 || sessions.Downstream[0].WorkerID != downstreamWorker.ID {
		t.Fatalf("/api/v1/sessions: %d %s", status, sessionsBody)
	}
	if status, body := adminGet("/api/v1/tenants/secret-customer/link", adminToken); status != http.StatusOK || strings.Contains(body, token) {
		t.Fatalf("/api/v1/tenants/secret-customer/link: %d, or it holds the token: %s", status, body)
	}
	// The dashboard at /: a login with the admin token, then the
	// tenant's link ok and its worker live, never the upstream token.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	dresp, err := browser.PostForm(base+"/login", url.Values{"token": {adminToken}, "next": {"/"}})
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(dresp.Body)
	dresp.Body.Close()
	if dresp.StatusCode != http.StatusOK || !strings.Contains(string(page), `data-tenant="secret-customer" data-state="ok"`) || strings.Contains(string(page), token) {
		t.Fatalf("dashboard's tenants page: %d\n%s", dresp.StatusCode, page)
	}
	if dresp, err = browser.Get(base + "/workers"); err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(dresp.Body)
	dresp.Body.Close()
	if !strings.Contains(string(page), `data-worker="`+downstreamWorker.ID+`" data-live="true"`) {
		t.Fatalf("dashboard's workers page:\n%s", page)
	}
	if m := metrics(); m["go_goroutines"] == nil || m["process_cpu_seconds_total"] == nil {
		t.Fatal("/metrics lacks the runtime and process series")
	}
	// The worker's token and the admin token were argon2id checks that
	// matched; the call without a token ran none.
	if n := metrics().Value("gradient_secret_argon2id_verifications_total", map[string]string{"result": "match"}); n < 2 {
		t.Fatalf("argon2id checks that matched: %v, want the worker's and the admin token's", n)
	}
	// Deleting the tenant leaves none of its series: its upstream
	// session's and its hub's go with it.
	tenantSeries := func() []string {
		var out []string
		for name, f := range metrics() {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "tenant" && (l.GetValue() == tenant.ID || l.GetValue() == "secret-customer") {
						out = append(out, name)
					}
				}
			}
		}
		return out
	}
	waitfor.Within(t, 15*time.Second, "the hub's series of the tenant", func() bool {
		return slices.ContainsFunc(tenantSeries(), func(n string) bool { return strings.HasPrefix(n, "gradient_proxy_hub_") })
	})
	// /metrics answers anyone: its series name tenants by ID, never by
	// name (a name may be a customer's).
	if raw := scrapeText(t, base+"/metrics"); strings.Contains(raw, "secret-customer") {
		t.Fatalf("/metrics names the tenant:\n%s", grepLines(raw, "secret-customer"))
	}
	req, _ := http.NewRequest("DELETE", base+"/api/v1/tenants/secret-customer", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	delResp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	delResp.Body.Close()
	if delResp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE /api/v1/tenants/secret-customer: %s", delResp.Status)
	}
	waitfor.Within(t, 15*time.Second, "no series of the deleted tenant", func() bool { return len(tenantSeries()) == 0 })
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Fatalf("/healthz: %s %q", resp.Status, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	waitfor.Within(t, 15*time.Second, "the session closed when the proxy stopped", func() bool { return !srv.WorkerStatus(proxyID).Live })

	out := logs.String()
	if !strings.Contains(out, `"msg":"gradient-proxy listening"`) || !strings.Contains(out, `"upstream_capabilities":["fetch","eval","build"]`) {
		t.Fatalf("no start line with the configuration:\n%s", out)
	}
	for name, secret := range map[string]string{"upstream token": token, "admin token": adminToken, "encryption key": sealbox.EncodeKey(key)} {
		if strings.Contains(out, secret) {
			t.Errorf("the %s reached the log", name)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dataDir, "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(token)) {
			t.Fatalf("%s holds the upstream token in plaintext", filepath.Base(f))
		}
	}
	if !slices.ContainsFunc(files, func(f string) bool { return filepath.Base(f) == "proxy.db" }) {
		t.Fatalf("the data directory holds %v, no proxy.db", files)
	}
}

func TestServeRefusesABadKey(t *testing.T) {
	t.Parallel()
	bad := writeFile(t, "bad.key", "not a key")
	opts, err := parseOptions([]string{"--database", t.TempDir(), "--encryption-key-file", bad}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = serve(t.Context(), opts, slog.New(slog.DiscardHandler), nil)
	if err == nil || !strings.Contains(err.Error(), "encryption key") {
		t.Fatalf("serve with a bad key: %v, want a refusal naming the encryption key", err)
	}
}

// With a Hetzner token file the proxy runs the reconciler against the
// configured endpoint with that token: its passes list the labelled
// servers, the calls show in /metrics, and the token is never logged.
func TestServeRunsTheHetznerReconciler(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var lists int
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer hc-secret-token" || r.URL.Path != "/servers" || r.URL.Query().Get("label_selector") != "gradient-tenant" {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"code":"unauthorized","message":"no"}}`))
			return
		}
		mu.Lock()
		lists++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"servers":[],"meta":{"pagination":{"page":1,"per_page":50,"last_page":1,"total_entries":0}}}`))
	}))
	t.Cleanup(api.Close)
	keyFile := writeFile(t, "proxy.key", sealbox.EncodeKey(sealbox.NewKey())+"\n")
	base, logs, stop := startProxy(t, []string{"--listen", "127.0.0.1:0", "--database", t.TempDir(), "--encryption-key-file", keyFile,
		"--hetzner-token-file", writeFile(t, "hcloud", "hc-secret-token\n"), "--hetzner-endpoint", api.URL,
		"--hetzner-proto-url", "wss://proxy.example/proto", "--hetzner-reconcile-interval", "1"}, nil)
	waitfor.True(t, "two reconcile passes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lists >= 2
	})
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `gradient_proxy_hetzner_api_calls_total{operation="list_servers",outcome="ok"}`) {
		t.Fatal("/metrics lacks the Hetzner API calls")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "hc-secret-token") {
		t.Fatal("the Hetzner token is in the log")
	}
}

// scrapeText is the text exposition /metrics answers.
func scrapeText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// grepLines are the lines of text that contain fragment.
func grepLines(text, fragment string) string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.Contains(line, fragment) {
			out = append(out, strings.TrimSuffix(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}

// Link URLs may not point at link-local or cloud metadata addresses
// unless --allow-link-local-links: the admin API refuses to set one (400
// naming the flag), and a link that holds one anyway (stored before, or a
// name resolving there) is refused at dial time, before any connect.
// Loopback stays allowed.
func TestServeRefusesLinkLocalLinks(t *testing.T) {
	t.Parallel()
	key := sealbox.NewKey()
	keyFile := writeFile(t, "proxy.key", sealbox.EncodeKey(key)+"\n")
	dataDir := t.TempDir()
	box, err := sealbox.New(key)
	if err != nil {
		t.Fatal(err)
	}
	store, err := proxystore.Open(t.Context(), dataDir, box)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.CreateTenant(t.Context(), "acme"); err != nil {
		t.Fatal(err)
	}
	workerID, peerID := storage.NewID(), storage.NewID()
	token := strings.Repeat("t", 64)
	metadataURL := "ws://169.254.169.254:80/proto"
	if _, err := store.SetLink(t.Context(), "acme", metadataURL, workerID, []proxystore.PeerToken{{PeerID: peerID, Token: token}}); err != nil {
		t.Fatal(err)
	}
	store.Close()

	const adminToken = "proxy-link-local-test-admin-token"
	env := map[string]string{"GRADIENT_PROXY_ENCRYPTION_KEY_FILE": keyFile, "GRADIENT_PROXY_ADMIN_TOKEN_FILE": writeFile(t, "admin", adminToken)}
	base, logs, stop := startProxy(t, []string{"--listen", "127.0.0.1:0", "--database", dataDir}, env)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	waitfor.Within(t, 15*time.Second, "the stored link's dial refused", func() bool {
		return strings.Contains(logs.String(), "dial tcp 169.254.169.254:80: 169.254.169.254: link-local and cloud metadata addresses are refused")
	})
	setLink := func(base, url string) (int, string) {
		body, _ := json.Marshal(map[string]string{"url": url, "worker_id": workerID, "peers": peerID + ":" + token})
		req, _ := http.NewRequest("PUT", base+"/api/v1/tenants/acme/link", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, url := range []string{metadataURL, "wss://[fd00:ec2::254]/proto", "ws://[fe80::1%25eth0]:3000/proto", "ws://[::ffff:169.254.169.254]/proto"} {
		if status, body := setLink(base, url); status != http.StatusBadRequest || !strings.Contains(body, "--allow-link-local-links") {
			t.Errorf("setting the link to %s: %d %s, want 400 naming --allow-link-local-links", url, status, body)
		}
	}
	if status, body := setLink(base, "ws://127.0.0.1:1/proto"); status != http.StatusOK {
		t.Errorf("setting a loopback link: %d %s, want 200", status, body)
	}
	stop()

	// Allowed by the operator: set, and dialed without the refusal.
	refusals := strings.Count(logs.String(), "addresses are refused")
	base, logs, _ = startProxy(t, []string{"--listen", "127.0.0.1:0", "--database", dataDir, "--allow-link-local-links"}, env)
	if status, body := setLink(base, metadataURL); status != http.StatusOK {
		t.Fatalf("setting the link with --allow-link-local-links: %d %s", status, body)
	}
	waitfor.Within(t, 15*time.Second, "the proxy dialing the allowed link", func() bool {
		return strings.Contains(logs.String(), "dialing without TLS") && strings.Contains(logs.String(), "169.254.169.254")
	})
	if strings.Contains(logs.String(), "addresses are refused") {
		t.Errorf("an allowed link was refused (%d refusals before):\n%s", refusals, logs.String())
	}
}
