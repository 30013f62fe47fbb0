package forge

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
)

func TestParseKind(t *testing.T) {
	for in, want := range map[string]Kind{"github": GitHub, "GitHub": GitHub, "gitea": Gitea, "forgejo": Gitea, "Forgejo": Gitea, "gitlab": GitLab} {
		got, err := ParseKind(in)
		if err != nil || got != want {
			t.Errorf("ParseKind(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "bitbucket", "git"} {
		if _, err := ParseKind(in); err == nil {
			t.Errorf("ParseKind(%q) accepted", in)
		}
	}
}

func testKeyPEM(t testing.TB, pkcs8 bool) []byte {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	if pkcs8 {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
}

func TestLinkValidate(t *testing.T) {
	pkcs1, pkcs8 := testKeyPEM(t, false), testKeyPEM(t, true)
	const token = "ghp_secretsecretsecret"
	ok := []Link{
		{Kind: GitHub, APIURL: "https://api.github.com", Repository: "owner/repo", Token: token},
		{Kind: GitHub, APIURL: "https://ghe.example.com/api/v3", Repository: "owner/repo.nix", Token: token},
		{Kind: GitHub, APIURL: "https://api.github.com", Repository: "owner/repo", App: &GitHubApp{AppID: 1, PrivateKeyPEM: pkcs1}},
		{Kind: GitHub, APIURL: "https://api.github.com", Repository: "owner/repo", App: &GitHubApp{AppID: 1, PrivateKeyPEM: pkcs8}},
		{Kind: Gitea, APIURL: "https://codeberg.org", Repository: "owner/repo", Token: token},
		{Kind: GitLab, APIURL: "https://gitlab.com", Repository: "group/sub/sub2/name", Token: token},
		{Kind: GitLab, APIURL: "http://127.0.0.1:8080", Repository: "group/name", Token: token},
		{Kind: Gitea, APIURL: "http://localhost:3000/", Repository: "o/r", Token: token},
		{Kind: Gitea, APIURL: "http://[::1]:3000", Repository: "o/r", Token: token},
	}
	for _, l := range ok {
		if err := l.Validate(); err != nil {
			t.Errorf("Validate(%s %s %s) = %v", l.Kind, l.APIURL, l.Repository, err)
		}
	}
	bad := []struct {
		link Link
		want string
	}{
		{Link{Kind: "bitbucket", APIURL: "https://x", Repository: "o/r", Token: token}, "unknown kind"},
		{Link{Kind: GitHub, APIURL: "", Repository: "o/r", Token: token}, "API URL is required"},
		{Link{Kind: GitHub, APIURL: "http://github.example.com", Repository: "o/r", Token: token}, "http only to a loopback"},
		{Link{Kind: GitHub, APIURL: "ftp://github.example.com", Repository: "o/r", Token: token}, "scheme must be https"},
		{Link{Kind: GitHub, APIURL: "https://user:pw@github.example.com", Repository: "o/r", Token: token}, "credentials"},
		{Link{Kind: GitHub, APIURL: "https://github.example.com?x=1", Repository: "o/r", Token: token}, "no query"},
		{Link{Kind: GitHub, APIURL: "https:///path", Repository: "o/r", Token: token}, "no host"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "a/b/c", Token: token}, "owner/name"},
		{Link{Kind: Gitea, APIURL: "https://x.org", Repository: "repo", Token: token}, "owner/name"},
		{Link{Kind: GitLab, APIURL: "https://x.org", Repository: "repo", Token: token}, "group/name"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "o/..", Token: token}, "not a valid name"},
		{Link{Kind: GitLab, APIURL: "https://x.org", Repository: "g//r", Token: token}, "not a valid name"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "o/r%2F", Token: token}, "not a valid name"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "o/" + strings.Repeat("r", 600), Token: token}, "longer than"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "o/r"}, "token or a GitHub App is required"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "o/r", Token: token, App: &GitHubApp{AppID: 1, PrivateKeyPEM: pkcs1}}, "not both"},
		{Link{Kind: Gitea, APIURL: "https://x.org", Repository: "o/r", App: &GitHubApp{AppID: 1, PrivateKeyPEM: pkcs1}}, "only with kind github"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "o/r", App: &GitHubApp{AppID: 0, PrivateKeyPEM: pkcs1}}, "positive"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "o/r", App: &GitHubApp{AppID: 1, PrivateKeyPEM: []byte("not a key")}}, "not PEM"},
		{Link{Kind: GitHub, APIURL: "https://api.github.com", Repository: "o/r", Token: "ghp_abc\r\nX-Evil: 1"}, "white space"},
	}
	for _, tt := range bad {
		err := tt.link.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Validate(%s %s %q) = %v, want an error with %q", tt.link.Kind, tt.link.APIURL, tt.link.Repository, err, tt.want)
			continue
		}
		if strings.Contains(err.Error(), "ghp_abc") || strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Errorf("Validate's error shows a credential: %v", err)
		}
	}
}

func TestDefaultAPIURL(t *testing.T) {
	if got := DefaultAPIURL(GitHub); got != "https://api.github.com" {
		t.Errorf("DefaultAPIURL(github) = %q", got)
	}
	if DefaultAPIURL(Gitea) != "" || DefaultAPIURL(GitLab) != "" {
		t.Error("Gitea and GitLab have no default API URL")
	}
}
