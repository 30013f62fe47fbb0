package dashboard

import "testing"

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
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}
