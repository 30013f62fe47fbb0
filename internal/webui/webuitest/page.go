package webuitest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"gradient.dev/gradient/internal/waitfor"
)

// Page drives a browser tab for a test: actions that fail the test,
// waits that poll the page, and screenshots.
type Page struct {
	T     testing.TB
	Ctx   context.Context
	Shots string        // where Shot writes (Artifacts)
	Wait  time.Duration // how long Until waits
}

// Do runs the actions; an error fails the test.
func (p *Page) Do(actions ...chromedp.Action[chromedp.Void]) {
	p.T.Helper()
	if err := chromedp.Do(p.Ctx, actions...); err != nil {
		p.T.Fatal(err)
	}
}

// Text is the element's text; "" while the page is being replaced.
func (p *Page) Text(sel string) string {
	p.T.Helper()
	s, err := chromedp.Run(p.Ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		if p.Ctx.Err() != nil {
			p.T.Fatal(err)
		}
		p.T.Logf("reading %s: %v (retried)", sel, err)
		return ""
	}
	return s
}

// Eval is the number the expression evaluates to.
func (p *Page) Eval(expr string) int {
	p.T.Helper()
	n, err := chromedp.Run(p.Ctx, chromedp.Evaluate[int](expr))
	if err != nil {
		p.T.Fatal(err)
	}
	return n
}

// Until polls cond for at most p.Wait.
func (p *Page) Until(what string, cond func() bool) {
	p.T.Helper()
	waitfor.Within(p.T, p.Wait, what, cond)
}

// WaitText waits for the element's text to contain want.
func (p *Page) WaitText(sel, want string) {
	p.T.Helper()
	p.Until(sel+" shows "+want, func() bool {
		if strings.Contains(p.Text(sel), want) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
		return false
	})
}

// ReloadUntil reloads the page until the expression is true.
func (p *Page) ReloadUntil(expr, what string) {
	p.T.Helper()
	p.Until(what, func() bool {
		ok, err := chromedp.Run(p.Ctx, chromedp.Evaluate[bool](expr))
		if err != nil {
			if p.Ctx.Err() != nil {
				p.T.Fatal(err)
			}
			// The reload may still be replacing the page ("Not attached
			// to an active page"): ask again until Wait runs out.
			p.T.Logf("evaluating %s: %v (retried)", expr, err)
			time.Sleep(300 * time.Millisecond)
			return false
		}
		if !ok {
			time.Sleep(300 * time.Millisecond)
			p.Do(chromedp.Reload())
		}
		return ok
	})
}

// Shot writes a screenshot of the page as NAME.jpg into p.Shots.
func (p *Page) Shot(name string) {
	p.T.Helper()
	var img []byte
	// A page still being laid out has no size yet: try again.
	p.Until("a screenshot of "+name, func() bool {
		var err error
		img, err = chromedp.Run(p.Ctx, chromedp.FullScreenshot(80))
		if err != nil {
			if p.Ctx.Err() != nil {
				p.T.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			return false
		}
		return true
	})
	if err := os.WriteFile(filepath.Join(p.Shots, name+".jpg"), img, 0o644); err != nil {
		p.T.Fatal(err)
	}
}
