package forgetest

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"testing"
	"time"

	"gradient.dev/gradient/server/forge"
)

func signJWT(t *testing.T, app *forge.GitHubApp, claims map[string]any) string {
	t.Helper()
	block, _ := pem.Decode(app.PrivateKeyPEM)
	key, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(claims)
	signing := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + base64.RawURLEncoding.EncodeToString(body)
	digest := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(nil, key, crypto.SHA256, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// The fake refuses JWTs GitHub refuses, so the client's App tests prove
// its JWTs are right.
func TestFakeChecksAppJWT(t *testing.T) {
	app := NewApp(t, 123)
	fake := New(t, forge.GitHub, Options{App: app})
	now := time.Now().Unix()
	tests := []struct {
		name   string
		claims map[string]any
		want   int
	}{
		{"good", map[string]any{"iat": now - 60, "exp": now + 540, "iss": "123"}, http.StatusOK},
		{"numeric iss", map[string]any{"iat": now - 60, "exp": now + 540, "iss": 123}, http.StatusOK},
		{"other app", map[string]any{"iat": now - 60, "exp": now + 540, "iss": "124"}, http.StatusUnauthorized},
		{"too long", map[string]any{"iat": now - 60, "exp": now + 3600, "iss": "123"}, http.StatusUnauthorized},
		{"expired", map[string]any{"iat": now - 700, "exp": now - 100, "iss": "123"}, http.StatusUnauthorized},
		{"future iat", map[string]any{"iat": now + 300, "exp": now + 600, "iss": "123"}, http.StatusUnauthorized},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(http.MethodGet, fake.URL()+"/repos/owner/repo/installation", nil)
		req.Header.Set("Authorization", "Bearer "+signJWT(t, app, tt.claims))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, resp.StatusCode, tt.want)
		}
	}
	other := NewApp(t, 123)
	req, _ := http.NewRequest(http.MethodGet, fake.URL()+"/repos/owner/repo/installation", nil)
	req.Header.Set("Authorization", "Bearer "+signJWT(t, other, map[string]any{"iat": now - 60, "exp": now + 540, "iss": "123"}))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("another key's JWT: %d, want 401", resp.StatusCode)
	}
}
