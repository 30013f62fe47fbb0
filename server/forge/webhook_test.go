package forge

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

var testSecret = []byte("It's a Secret to Everybody")

// GitHub's documented example: this secret and body give this signature.
func TestVerifyGitHubDocumentedExample(t *testing.T) {
	h := http.Header{}
	h.Set("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
	if err := Verify(GitHub, testSecret, h, []byte("Hello, World!")); err != nil {
		t.Fatalf("Verify of GitHub's documented example: %v", err)
	}
}

func TestVerify(t *testing.T) {
	body := []byte(`{"ref":"refs/heads/main"}`)
	good := Sign(testSecret, body)
	other := Sign([]byte("another secret"), body)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	tests := []struct {
		name string
		kind Kind
		h    http.Header
		body []byte
		ok   bool
	}{
		{"github good", GitHub, hdr("X-Hub-Signature-256", "sha256="+good), body, true},
		{"github uppercase hex", GitHub, hdr("X-Hub-Signature-256", "sha256="+strings.ToUpper(good)), body, true},
		{"github wrong secret", GitHub, hdr("X-Hub-Signature-256", "sha256="+other), body, false},
		{"github missing", GitHub, hdr(), body, false},
		{"github no prefix", GitHub, hdr("X-Hub-Signature-256", good), body, false},
		{"github truncated", GitHub, hdr("X-Hub-Signature-256", "sha256="+good[:62]), body, false},
		{"github empty", GitHub, hdr("X-Hub-Signature-256", "sha256="), body, false},
		{"github tampered body", GitHub, hdr("X-Hub-Signature-256", "sha256="+good), []byte(`{"ref":"refs/heads/evil"}`), false},
		{"github sha1 only", GitHub, hdr("X-Hub-Signature", "sha1="+good[:40]), body, false},
		{"github twice", GitHub, hdr("X-Hub-Signature-256", "sha256="+good, "X-Hub-Signature-256", "sha256="+good), body, false},
		{"github with gitea header", GitHub, hdr("X-Gitea-Signature", good), body, false},

		{"gitea good", Gitea, hdr("X-Gitea-Signature", good), body, true},
		{"forgejo good", Gitea, hdr("X-Forgejo-Signature", good), body, true},
		{"gitea hub header only", Gitea, hdr("X-Hub-Signature-256", "sha256="+good), body, true},
		{"gitea all three", Gitea, hdr("X-Gitea-Signature", good, "X-Forgejo-Signature", good, "X-Hub-Signature-256", "sha256="+good), body, true},
		{"gitea one of two wrong", Gitea, hdr("X-Gitea-Signature", good, "X-Hub-Signature-256", "sha256="+other), body, false},
		{"forgejo wrong beside good gitea", Gitea, hdr("X-Gitea-Signature", good, "X-Forgejo-Signature", other), body, false},
		{"gitea wrong secret", Gitea, hdr("X-Gitea-Signature", other), body, false},
		{"gitea missing", Gitea, hdr(), body, false},
		{"gitea truncated", Gitea, hdr("X-Gitea-Signature", good[:63]), body, false},
		{"gitea not hex", Gitea, hdr("X-Gitea-Signature", strings.Repeat("zz", 32)), body, false},
		{"gitea prefixed", Gitea, hdr("X-Gitea-Signature", "sha256="+good), body, false},
		{"gitea gitlab token", Gitea, hdr("X-Gitlab-Token", string(testSecret)), body, false},

		{"gitlab good", GitLab, hdr("X-Gitlab-Token", string(testSecret)), body, true},
		{"gitlab wrong", GitLab, hdr("X-Gitlab-Token", "It's a Secret to Everybod"), body, false},
		{"gitlab longer", GitLab, hdr("X-Gitlab-Token", string(testSecret)+"!"), body, false},
		{"gitlab missing", GitLab, hdr(), body, false},
		{"gitlab empty", GitLab, hdr("X-Gitlab-Token", ""), body, false},
		{"gitlab hmac instead", GitLab, hdr("X-Hub-Signature-256", "sha256="+good), body, false},
		{"gitlab twice", GitLab, hdr("X-Gitlab-Token", string(testSecret), "X-Gitlab-Token", "x"), body, false},

		{"unknown kind", Kind("bitbucket"), hdr("X-Hub-Signature-256", "sha256="+good), body, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Verify(tt.kind, testSecret, tt.h, tt.body)
			if tt.ok && err != nil {
				t.Fatalf("Verify refused a good delivery: %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrSignature) {
				t.Fatalf("Verify = %v, want ErrSignature", err)
			}
		})
	}
}

// An empty secret (a project whose secret was never set) verifies
// nothing, not even a delivery signed with the empty key.
func TestVerifyEmptySecret(t *testing.T) {
	body := []byte(`{}`)
	for _, k := range []Kind{GitHub, Gitea, GitLab} {
		h := http.Header{}
		h.Set("X-Hub-Signature-256", "sha256="+Sign(nil, body))
		h.Set("X-Gitea-Signature", Sign(nil, body))
		h.Set("X-Gitlab-Token", "")
		if err := Verify(k, nil, h, body); !errors.Is(err, ErrSignature) {
			t.Errorf("%s: Verify with an empty secret = %v, want ErrSignature", k, err)
		}
	}
}

func TestDeliveryID(t *testing.T) {
	const id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	tests := []struct {
		kind   Kind
		header string
		value  string
		want   string
	}{
		{GitHub, "X-GitHub-Delivery", id, id},
		{Gitea, "X-Gitea-Delivery", id, id},
		{Gitea, "X-Forgejo-Delivery", id, id},
		{GitLab, "X-Gitlab-Event-UUID", id, id},
		{GitLab, "X-Gitlab-Webhook-UUID", id, ""}, // the hook's, not the delivery's
		{GitHub, "X-Gitea-Delivery", id, ""},
		{GitHub, "X-GitHub-Delivery", "with space", ""},
		{GitHub, "X-GitHub-Delivery", strings.Repeat("a", 129), ""},
		{GitHub, "X-GitHub-Delivery", strings.Repeat("a", 128), strings.Repeat("a", 128)},
	}
	for _, tt := range tests {
		h := http.Header{}
		h.Set(tt.header, tt.value)
		if got := DeliveryID(tt.kind, h); got != tt.want {
			t.Errorf("DeliveryID(%s, %s: %q) = %q, want %q", tt.kind, tt.header, tt.value, got, tt.want)
		}
	}
}

func TestPullRef(t *testing.T) {
	for _, tt := range []struct {
		kind Kind
		want string
	}{{GitHub, "refs/pull/12/head"}, {Gitea, "refs/pull/12/head"}, {GitLab, "refs/merge-requests/12/head"}} {
		if got := PullRef(tt.kind, 12); got != tt.want {
			t.Errorf("PullRef(%s, 12) = %q, want %q", tt.kind, got, tt.want)
		}
	}
}
