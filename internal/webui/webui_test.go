package webui

import (
	"net/http/httptest"
	"testing"
)

// The page a login returns to stays on this site.
func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"/workers":             "/workers",
		"/evaluations/x?a=b":   "/evaluations/x?a=b",
		"":                     "/",
		"https://evil.example": "/",
		"//evil.example":       "/",
		"/\\evil.example":      "/",
		"/\t/evil.example":     "/",
		"/\n/evil.example":     "/",
		"/\x7f":                "/",
	} {
		if got := SafeNext(next); got != want {
			t.Errorf("SafeNext(%q) = %q, want %q", next, got, want)
		}
	}
}

// A form posted from another site is refused; one from this site, or
// from a client that names no origin, is not.
func TestSameOrigin(t *testing.T) {
	for _, c := range []struct {
		origin, referer string
		want            bool
	}{
		{"", "", true},
		{"http://example.test", "", true},
		{"https://evil.example", "", false},
		{"null", "https://evil.example/x", false},
		{"", "http://example.test/workers", true},
		{"", "http://evil.example/workers", false},
	} {
		r := httptest.NewRequest("POST", "http://example.test/login", nil)
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.referer != "" {
			r.Header.Set("Referer", c.referer)
		}
		if got := SameOrigin(r); got != c.want {
			t.Errorf("Origin %q Referer %q: %v, want %v", c.origin, c.referer, got, c.want)
		}
	}
}
