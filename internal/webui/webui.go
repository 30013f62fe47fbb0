// Package webui holds what the server's and the proxy's dashboards share
// about serving pages to a browser: the same-origin check of a form's
// POST, the redirect target kept on the site, and the security headers.
package webui

import (
	"net/http"
	"net/url"
	"strings"
)

// SameOrigin refuses a browser's cross-site POST: Origin (or Referer)
// must name this host when present.
func SameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || origin == "null" {
		origin = r.Header.Get("Referer")
	}
	if origin == "" {
		return true // not a browser, or one that sends neither
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// SafeNext keeps a redirect after login on this site: a path, or "/".
func SafeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\t\r\n") {
		return "/"
	}
	for _, c := range next {
		if c < 0x20 || c == 0x7f {
			return "/"
		}
	}
	return next
}

// SecurityHeaders sets the Content-Security-Policy csp (what the pages
// may load: only their own assets) and forbids framing and sniffing.
func SecurityHeaders(csp string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}
