package dashboard_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/internal/webui/webuitest"
	"gradient.dev/gradient/proxy/admin/admintest"
	"gradient.dev/gradient/proxy/proxystore"
)

type proxyBrowser struct {
	t     *testing.T
	ctx   context.Context
	base  string
	shots string
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
	w := &proxyBrowser{t: t, ctx: ctx, base: p.URL, shots: webuitest.Artifacts(t)}
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
	w.do(chromedp.Navigate(w.base + "/"))
	w.waitText("#login-submit", "Log in")
	w.do(chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"), chromedp.Click(chromedp.CSS("#login-submit")))
	w.waitText("#login-error", "Wrong admin token")
	w.do(chromedp.SendKeys(chromedp.CSS("#token"), p.Token), chromedp.Click(chromedp.CSS("#login-submit")))
	w.waitText("h1", "Tenants")

	// A link with a wrong token: failing, with the server's reason.
	api(t, p, "POST", "/api/v1/tenants", map[string]string{"name": "acme"})
	api(t, p, "PUT", "/api/v1/tenants/acme/link", map[string]string{"url": ten.ProtoURL, "worker_id": ten.WorkerID,
		"peers": peer + ":" + strings.Repeat("x", len(token))})
	w.reloadUntil(`document.querySelector('tr.tenant-row[data-tenant="acme"][data-state="failing"] .link-reason') !== null`,
		"the link shows failing with a reason")
	if reason := w.text(`tr.tenant-row[data-tenant="acme"] .link-reason`); strings.TrimSpace(reason) == "" {
		t.Fatal("a failing link without its reason")
	}
	w.shot("link-failing")

	// Set right: ok, the upstream session live.
	api(t, p, "PUT", "/api/v1/tenants/acme/link", map[string]string{"url": ten.ProtoURL, "worker_id": ten.WorkerID, "peers": ten.Peers})
	w.reloadUntil(`document.querySelector('tr.tenant-row[data-tenant="acme"][data-state="ok"] .st-live') !== null`,
		"the link shows ok with a live session")
	w.shot("link-ok")

	// A VM the reconciler booted appears, running, in the list and chart.
	vm, _, err := p.Store.BeginVM(t.Context(), "acme", proxystore.NewVM{System: "x86_64-linux", ServerType: "cx22", Location: "fsn1",
		Allowed: proxystore.Capabilities{Build: true}}, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Store.VMCreated(t.Context(), vm.ID, 4242, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	w.do(chromedp.Navigate(w.base + "/vms"))
	w.waitText(`tr.vm-row[data-outcome="running"]`, "#4242")
	w.waitText("#vm-chart", "1")
	w.shot("vms")

	// Log out: the pages need a login again.
	w.do(chromedp.Click(chromedp.CSS("#logout")))
	w.waitText("h1", "Log in")
	w.do(chromedp.Navigate(w.base + "/workers"))
	w.waitText("h1", "Log in")
}

func (w *proxyBrowser) do(actions ...chromedp.Action[chromedp.Void]) {
	w.t.Helper()
	if err := chromedp.Do(w.ctx, actions...); err != nil {
		w.t.Fatal(err)
	}
}

// text is the element's text; "" while the page is being replaced.
func (w *proxyBrowser) text(sel string) string {
	w.t.Helper()
	s, err := chromedp.Run(w.ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		if w.ctx.Err() != nil {
			w.t.Fatal(err)
		}
		return ""
	}
	return s
}

func (w *proxyBrowser) until(what string, cond func() bool) {
	w.t.Helper()
	waitfor.Within(w.t, 2*time.Minute, what, cond)
}

func (w *proxyBrowser) waitText(sel, want string) {
	w.t.Helper()
	w.until(sel+" shows "+want, func() bool {
		if strings.Contains(w.text(sel), want) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
		return false
	})
}

// reloadUntil reloads the page until the expression is true.
func (w *proxyBrowser) reloadUntil(expr, what string) {
	w.t.Helper()
	w.until(what, func() bool {
		ok, err := chromedp.Run(w.ctx, chromedp.Evaluate[bool](expr))
		if err != nil {
			w.t.Fatal(err)
		}
		if !ok {
			time.Sleep(300 * time.Millisecond)
			w.do(chromedp.Reload())
		}
		return ok
	})
}

func (w *proxyBrowser) shot(name string) {
	w.t.Helper()
	var img []byte
	w.until("a screenshot of "+name, func() bool {
		var err error
		img, err = chromedp.Run(w.ctx, chromedp.FullScreenshot(80))
		if err != nil {
			if w.ctx.Err() != nil {
				w.t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			return false
		}
		return true
	})
	if err := os.WriteFile(filepath.Join(w.shots, name+".jpg"), img, 0o644); err != nil {
		w.t.Fatal(err)
	}
}
