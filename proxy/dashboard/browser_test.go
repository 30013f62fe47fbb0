package dashboard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"gradient.dev/gradient/internal/webui/webuitest"
	"gradient.dev/gradient/proxy/admin/admintest"
	"gradient.dev/gradient/proxy/proxystore"
)

type proxyBrowser struct {
	*webuitest.Page
	t    *testing.T
	base string
}

// TestProxyDashboardInBrowser drives Debian's chromium against a proxy and
// a tenant's real server on loopback: log in; a link set with a wrong
// token shows failing with the server's reason, and ok once set right; a
// booted VM appears on the VM page with the chart.
func TestProxyDashboardInBrowser(t *testing.T) {
	browser := webuitest.Chromium(t)
	dir := t.TempDir()
	p := admintest.Start(t, dir, admintest.Options{})
	ten := admintest.TenantServer(t, dir)
	peer, token, _ := strings.Cut(ten.Peers, ":")
	browserCtx := webuitest.Start(t, browser, 1280, 900)
	ctx, cancel := context.WithTimeout(browserCtx, 4*time.Minute)
	defer cancel()
	w := &proxyBrowser{Page: &webuitest.Page{T: t, Ctx: ctx, Shots: webuitest.Artifacts(t), Wait: 2 * time.Minute}, t: t, base: p.URL}
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			t.Errorf("a JavaScript dialog opened: %q", ev.Message)
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()

	// Log in with the admin token: a wrong one first.
	w.Do(chromedp.Navigate(w.base + "/"))
	w.WaitText("#login-submit", "Log in")
	w.Do(chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"), chromedp.Click(chromedp.CSS("#login-submit")))
	w.WaitText("#login-error", "Wrong admin token")
	w.Do(chromedp.SendKeys(chromedp.CSS("#token"), p.Token), chromedp.Click(chromedp.CSS("#login-submit")))
	w.WaitText("h1", "Tenants")

	// A link with a wrong token: failing, with the server's reason.
	api(t, p, "POST", "/api/v1/tenants", map[string]string{"name": "acme"})
	api(t, p, "PUT", "/api/v1/tenants/acme/link", map[string]string{"url": ten.ProtoURL, "worker_id": ten.WorkerID,
		"peers": peer + ":" + strings.Repeat("x", len(token))})
	w.ReloadUntil(`document.querySelector('tr.tenant-row[data-tenant="acme"][data-state="failing"] .link-reason') !== null`,
		"the link shows failing with a reason")
	if reason := w.Text(`tr.tenant-row[data-tenant="acme"] .link-reason`); strings.TrimSpace(reason) == "" {
		t.Fatal("a failing link without its reason")
	}
	w.Shot("link-failing")

	// Set right: ok, the upstream session live.
	api(t, p, "PUT", "/api/v1/tenants/acme/link", map[string]string{"url": ten.ProtoURL, "worker_id": ten.WorkerID, "peers": ten.Peers})
	w.ReloadUntil(`document.querySelector('tr.tenant-row[data-tenant="acme"][data-state="ok"] .st-live') !== null`,
		"the link shows ok with a live session")
	w.Shot("link-ok")

	// A VM the reconciler booted appears, running, in the list and chart.
	vm, _, err := p.Store.BeginVM(t.Context(), "acme", proxystore.NewVM{System: "x86_64-linux", ServerType: "cx22", Location: "fsn1",
		Allowed: proxystore.Capabilities{Build: true}}, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store.VMCreated(t.Context(), vm.ID, 4242, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	w.Do(chromedp.Navigate(w.base + "/vms"))
	w.WaitText(`tr.vm-row[data-outcome="running"]`, "#4242")
	w.WaitText("#vm-chart", "1")
	w.Shot("vms")

	// Log out: the pages need a login again.
	w.Do(chromedp.Click(chromedp.CSS("#logout")))
	w.WaitText("h1", "Log in")
	w.Do(chromedp.Navigate(w.base + "/workers"))
	w.WaitText("h1", "Log in")
}
