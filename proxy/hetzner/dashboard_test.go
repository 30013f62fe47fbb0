package hetzner

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/internal/webui/webuitest"
	"gradient.dev/gradient/proxy/admin"
	"gradient.dev/gradient/proxy/dashboard"
	"gradient.dev/gradient/proxy/upstream"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// A VM the reconciler boots through the Hetzner fake shows on the proxy
// dashboard's VM page, running, with the server the cloud named, once its
// worker connected; in a real browser too.
func TestDashboardShowsBootedVM(t *testing.T) {
	t.Parallel()
	r := newRig(t, sqldbtest.SQLiteURL(t))
	acme := r.tenant("acme")
	r.demand.set(acme.ID, x86, 1)
	r.pass()
	r.waitConnected(acme.ID, 1)
	r.pass() // marks the row connected
	rows := r.rows(acme.ID)
	if len(rows) != 1 || rows[0].ConnectedAt == nil {
		t.Fatalf("rows %+v, want one connected", rows)
	}
	servers := r.cloud.serversOf(acme.ID)
	if len(servers) != 1 {
		t.Fatalf("%d servers booted, want 1", len(servers))
	}

	const token = "proxy-dashboard-test-admin-token"
	hash, err := secret.Hash(token)
	if err != nil {
		t.Fatal(err)
	}
	sup, err := upstream.New(upstream.Config{Store: r.store, Capabilities: upstream.DefaultCapabilities, Pool: r.sessions.leg.Load()})
	if err != nil {
		t.Fatal(err)
	}
	api := admin.New(admin.Config{Store: r.store, AdminTokenHash: hash, Downstream: r.sessions.leg.Load(), Upstream: sup})
	hs := httptest.NewServer(dashboard.New(dashboard.Config{API: api}).Handler())
	t.Cleanup(hs.Close)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(hs.URL+"/login", url.Values{"token": {token}, "next": {"/vms?from=2026-11-30&to=2026-12-02"}})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(raw)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("VM page: %d %s", resp.StatusCode, body)
	}
	s := servers[0]
	for _, want := range []string{`data-server="` + s.Name + `" data-outcome="running"`, "#" + strconv.FormatInt(s.ID, 10), "fsn1", "cx22"} {
		if !strings.Contains(body, want) {
			t.Fatalf("VM page lacks %q:\n%s", want, body)
		}
	}
	if connected := rows[0].ConnectedAt.UTC().Format("2006-01-02 15:04:05"); !strings.Contains(body, connected) {
		t.Fatalf("the VM page lacks its connection time %s:\n%s", connected, body)
	}

	// The same VM in a real browser, after logging in through the form.
	ctx, cancel := context.WithTimeout(webuitest.Start(t, webuitest.Chromium(t), 1280, 900), 2*time.Minute)
	defer cancel()
	row := `tr.vm-row[data-server="` + s.Name + `"][data-outcome="running"]`
	present := func(sel string) bool {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('`+sel+`') !== null`))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(hs.URL+"/login?next="+url.QueryEscape("/vms?from=2026-11-30&to=2026-12-02"))); err != nil {
		t.Fatal(err)
	}
	waitfor.Within(t, time.Minute, "the login form", func() bool { return present("#token") })
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login-submit"))); err != nil {
		t.Fatal(err)
	}
	waitfor.Within(t, time.Minute, "the booted VM's row in the browser", func() bool { return present(row) })
	text, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(row)))
	if err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(90))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "#"+strconv.FormatInt(s.ID, 10)) || !strings.Contains(text, "fsn1") {
		t.Fatalf("the browser's VM row reads %q, want the server #%d in fsn1", text, s.ID)
	}
	if err := os.WriteFile(filepath.Join(webuitest.Artifacts(t), "vms.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
