package forge

import (
	"net/http"
	"testing"
	"time"
)

func TestRetryAfterForms(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	a := &apiClient{kind: GitHub, now: func() time.Time { return now }}
	tests := []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"120", 2 * time.Minute, true},
		{"0", 0, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"99999999999", maxRetryAfter, true},
		{"-5", 0, false},
		{"soon", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		h := http.Header{}
		h.Set("Retry-After", tt.value)
		got, ok := a.retryAfter(h)
		if got != tt.want || ok != tt.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tt.value, got, ok, tt.want, tt.ok)
		}
	}
}

// Forgejo names its headers X-Forgejo-*; a delivery with only those parses.
func TestParseForgejoHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("X-Forgejo-Event", "pull_request")
	h.Set("X-Forgejo-Event-Type", "pull_request_sync")
	ev, err := Parse(Gitea, h, readTestdata(t, "gitea/pull_request_synchronized_fork.json"))
	if err != nil || ev.Type != EventPullRequest || ev.PR.Action != PRSynchronized || !ev.PR.FromFork {
		t.Fatalf("Parse = %+v, %v", ev, err)
	}
	h.Set("X-Forgejo-Event-Type", "pull_request_label")
	if ev, err := Parse(Gitea, h, readTestdata(t, "gitea/pull_request_synchronized_fork.json")); err != nil || ev.Type != EventIgnored {
		t.Fatalf("a label change parsed as %+v, %v", ev, err)
	}
}
