package dashboard_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/proxy/admin/admintest"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(sqldbtest.Main(m))
}

// browser is an HTTP client with cookies that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (b *browser) do(method, path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(b.t.Context(), method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", b.base)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, string(raw)
}

// page GETs a page that must answer 200.
func (b *browser) page(path string) string {
	b.t.Helper()
	resp, body := b.do("GET", path, nil)
	if resp.StatusCode != http.StatusOK {
		b.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return body
}

func (b *browser) login(token string) *http.Response {
	b.t.Helper()
	resp, _ := b.do("POST", "/login", url.Values{"token": {token}, "next": {"/workers"}})
	return resp
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// Logging in takes the admin token; wrong ones are refused and counted by
// the per-address gate (429 after too many); the session cookie is
// HttpOnly and SameSite=Strict; logout needs the session's CSRF token and
// ends the session.
func TestLoginLogout(t *testing.T) {
	t.Parallel()
	p := admintest.Start(t, t.TempDir(), admintest.Options{AuthFailuresPerMinute: 2})
	b := newBrowser(t, p.URL)

	resp, _ := b.do("GET", "/workers", nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next=%2Fworkers" {
		t.Fatalf("logged out: %d to %q, want the login", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp := b.login("wrong"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", resp.StatusCode)
	}
	resp = b.login(p.Token)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/workers" {
		t.Fatalf("login: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "gradient_proxy_session" {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Secure || len(cookie.Value) < 40 {
		t.Fatalf("session cookie %+v", cookie)
	}
	if resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatal("no Content-Security-Policy")
	}
	body := b.page("/")
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no logout form with a CSRF token:\n%s", body)
	}
	if resp, _ := b.do("POST", "/logout", url.Values{"csrf": {strings.Repeat("0", 64)}}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("logout with a wrong CSRF token: %d", resp.StatusCode)
	}
	b.page("/sessions") // still logged in
	if resp, _ := b.do("POST", "/logout", url.Values{"csrf": {m[1]}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	// The old cookie no longer opens a page.
	other := newBrowser(t, p.URL)
	u, _ := url.Parse(p.URL)
	other.c.Jar.SetCookies(u, []*http.Cookie{{Name: cookie.Name, Value: cookie.Value}})
	if resp, _ := other.do("GET", "/", nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the ended session still reads pages: %d", resp.StatusCode)
	}

	// A second wrong login passes the limit of 2 per minute: held back,
	// the right token too, as on the admin API.
	if resp := b.login("wrong again"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("second wrong token: %d", resp.StatusCode)
	}
	if resp := b.login(p.Token); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after too many wrong tokens: %d, want 429", resp.StatusCode)
	}
	// A cross-site login form is refused.
	req, _ := http.NewRequestWithContext(t.Context(), "POST", p.URL+"/login", strings.NewReader("token=x"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site login: %v %v", resp, err)
	}
}

// api calls the proxy's admin API.
func api(t *testing.T, p *admintest.Proxy, method, path string, in any) {
	t.Helper()
	raw, _ := json.Marshal(in)
	req, _ := http.NewRequestWithContext(t.Context(), method, p.URL+path, strings.NewReader(string(raw)))
	req.Header.Set("Authorization", "Bearer "+p.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, body)
	}
}

// A link set with a wrong token shows failing with the tenant server's
// reason; set again with the right one it shows ok with a live session.
// Workers show per tenant.
func TestTenantsLinkState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := admintest.Start(t, dir, admintest.Options{})
	ten := admintest.TenantServer(t, dir)
	peer, token, _ := strings.Cut(ten.Peers, ":")
	api(t, p, "POST", "/api/v1/tenants", map[string]string{"name": "acme"})
	api(t, p, "POST", "/api/v1/tenants/acme/workers", map[string]string{"name": "builder-1"})
	b := newBrowser(t, p.URL)
	b.login(p.Token)

	api(t, p, "PUT", "/api/v1/tenants/acme/link", map[string]string{"url": ten.ProtoURL, "worker_id": ten.WorkerID,
		"peers": peer + ":" + strings.Repeat("x", len(token))})
	var body string
	waitfor.True(t, "the tenants page shows the link failing", func() bool {
		body = b.page("/")
		return strings.Contains(body, `data-state="failing"`)
	})
	if strings.Contains(body, token) || !regexp.MustCompile(`class="err link-reason">[^<]+<`).MatchString(body) {
		t.Fatalf("failing link without its reason (or with the token):\n%s", body)
	}
	api(t, p, "PUT", "/api/v1/tenants/acme/link", map[string]string{"url": ten.ProtoURL, "worker_id": ten.WorkerID, "peers": ten.Peers})
	waitfor.True(t, "the tenants page shows the link ok and its session live", func() bool {
		body = b.page("/")
		return strings.Contains(body, `data-state="ok"`) && strings.Contains(body, `st-live`)
	})
	if strings.Contains(body, token) {
		t.Fatal("the page holds the link's token")
	}
	if w := b.page("/workers"); !strings.Contains(w, "builder-1") || !strings.Contains(w, `data-live="false"`) {
		t.Fatalf("workers page:\n%s", w)
	}
	if s := b.page("/sessions"); !strings.Contains(s, `class="upstream-row" data-tenant="acme" data-live="true"`) {
		t.Fatalf("sessions page:\n%s", s)
	}
}

// A VM the reconciler booted (rows written as it writes them) shows on
// the VM page with its state and in the chart; what came from Hetzner is
// escaped; a bad period is said so.
func TestVMsPage(t *testing.T) {
	t.Parallel()
	p := admintest.Start(t, t.TempDir(), admintest.Options{})
	api(t, p, "POST", "/api/v1/tenants", map[string]string{"name": "acme"})
	ctx := t.Context()
	start := time.Now().Add(-2 * time.Hour)
	all := proxystore.Capabilities{Fetch: true, Eval: true, Build: true}
	vm, _, err := p.Store.BeginVM(ctx, "acme", proxystore.NewVM{System: "x86_64-linux", ServerType: "cx22",
		Location: `<script>alert("hetzner")</script>`, Allowed: all}, start)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store.VMCreated(ctx, vm.ID, 4242, start); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store.MarkVMConnected(ctx, vm.ID, start.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	ended, _, err := p.Store.BeginVM(ctx, "acme", proxystore.NewVM{System: "x86_64-linux", ServerType: "cx22", Allowed: all}, start)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store.VMCreated(ctx, ended.ID, 4243, start); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store.EndVMUsage(ctx, ended.ID, proxystore.VMFailedBoot, start.Add(10*time.Minute), 0); err != nil {
		t.Fatal(err)
	}

	b := newBrowser(t, p.URL)
	b.login(p.Token)
	body := b.page("/vms")
	for _, want := range []string{`data-outcome="running"`, `data-outcome="failed_boot"`, "#4242", "#4243",
		`&lt;script&gt;alert(&#34;hetzner&#34;)&lt;/script&gt;`, `data-max="2"`, "<polyline points="} {
		if !strings.Contains(body, want) {
			t.Fatalf("VM page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, `<script>alert`) {
		t.Fatal("the VM's location is not escaped")
	}
	// A period before the VMs: none listed, the chart flat at 0.
	if body := b.page("/vms?from=2020-01-01&to=2020-01-08"); !strings.Contains(body, "No VMs in the period.") || !strings.Contains(body, `data-max="0"`) {
		t.Fatalf("empty period:\n%s", body)
	}
	if body := b.page("/vms?from=yesterday"); !strings.Contains(body, `id="period-error"`) || !strings.Contains(body, "#4242") {
		t.Fatalf("bad period:\n%s", body)
	}
}
