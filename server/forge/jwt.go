package forge

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// parsePrivateKey reads an RSA key in PEM, PKCS#1 or PKCS#8. Its errors
// say what is wrong without quoting the key.
func parsePrivateKey(pemBytes []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, errors.New("forge: the GitHub App private key is not PEM")
	}
	switch block.Type {
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
		if err != nil {
			return nil, errors.New("forge: the GitHub App private key is not a valid PKCS#1 RSA key")
		}
		return k, nil
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, errors.New("forge: the GitHub App private key is not a valid PKCS#8 key")
		}
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, errors.New("forge: the GitHub App private key is not an RSA key")
		}
		return rk, nil
	}
	return nil, errors.New("forge: the GitHub App private key's PEM block is neither RSA PRIVATE KEY nor PRIVATE KEY")
}

// appJWTLifetime is how long an App's JWT is valid: GitHub takes at most
// 10 minutes, and the issue time is set a minute back for clock drift.
const (
	appJWTLifetime = 9 * time.Minute
	appJWTSkew     = 60 * time.Second
	// appTokenMargin: a cached installation token is replaced this long
	// before it expires, so no request starts with a token about to die.
	appTokenMargin = 5 * time.Minute
)

// appJWT is the RS256 JSON Web Token a GitHub App authenticates with.
func appJWT(appID int64, key *rsa.PrivateKey, now time.Time) (string, error) {
	header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))
	claims, err := json.Marshal(struct {
		IssuedAt  int64  `json:"iat"`
		ExpiresAt int64  `json:"exp"`
		Issuer    string `json:"iss"`
	}{now.Add(-appJWTSkew).Unix(), now.Add(appJWTLifetime).Unix(), strconv.FormatInt(appID, 10)})
	if err != nil {
		return "", err
	}
	signing := header + "." + base64.RawURLEncoding.EncodeToString(claims)
	digest := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(nil, key, crypto.SHA256, digest[:])
	if err != nil {
		return "", errors.New("forge: signing the GitHub App's JWT failed")
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// appTokens holds a GitHub App's installation on one repository and its
// cached installation token.
type appTokens struct {
	api         *apiClient
	appID       int64
	key         *rsa.PrivateKey
	owner, name string

	// mu is held across an exchange, so concurrent calls wait for one
	// token instead of each asking GitHub for their own.
	mu             sync.Mutex
	installationID int64
	token          string
	obtained       time.Time // when token was handed out
	expires        time.Time
	perms          map[string]string
}

// authorize sets the installation token on r: the cached one unless it
// was obtained before staleBefore (refused since) or is within
// appTokenMargin of its expiry. It answers true when the token came from
// the cache, so a 401 is worth one retry with a fresh one.
func (a *appTokens) authorize(ctx context.Context, r *http.Request, staleBefore time.Time) (bool, error) {
	token, cached, err := a.current(ctx, staleBefore)
	if err != nil {
		return false, err
	}
	r.Header.Set("Authorization", "Bearer "+token)
	return cached, nil
}

func (a *appTokens) current(ctx context.Context, staleBefore time.Time) (token string, cached bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.token != "" && a.obtained.After(staleBefore) && a.api.now().Before(a.expires.Add(-appTokenMargin)) {
		return a.token, true, nil
	}
	a.token = ""
	if err := a.exchange(ctx); err != nil {
		return "", false, err
	}
	return a.token, false, nil
}

// permissions are the installation token's permissions, as GitHub
// answered the exchange (statuses, metadata, …).
func (a *appTokens) permissions(ctx context.Context) (map[string]string, error) {
	if _, _, err := a.current(ctx, time.Time{}); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.perms, nil
}

// exchange finds the installation (GET /repos/{owner}/{repo}/installation)
// and makes a token for it limited to this repository (POST
// /app/installations/{id}/access_tokens), both with the App's JWT.
// Called with mu held.
func (a *appTokens) exchange(ctx context.Context) error {
	jwt, err := appJWT(a.appID, a.key, a.api.now())
	if err != nil {
		return err
	}
	bearer := func(_ context.Context, r *http.Request, _ time.Time) (bool, error) {
		r.Header.Set("Authorization", "Bearer "+jwt)
		return false, nil
	}
	app := &apiClient{kind: GitHub, base: a.api.base, hc: a.api.hc, auth: bearer, now: a.api.now}
	if a.installationID == 0 {
		var inst struct {
			ID int64 `json:"id"`
		}
		err := app.call(ctx, http.MethodGet, "/repos/"+url.PathEscape(a.owner)+"/"+url.PathEscape(a.name)+"/installation", nil, &inst)
		switch statusOf(err) {
		case http.StatusNotFound:
			return fmt.Errorf("forge: the GitHub App %d is not installed on %s/%s: %w", a.appID, a.owner, a.name, err)
		case http.StatusUnauthorized:
			return fmt.Errorf("forge: GitHub refused the App's JWT (wrong app ID or private key, or a clock far off): %w", err)
		}
		if err != nil {
			return err
		}
		if inst.ID <= 0 {
			return errors.New("forge: GitHub answered no installation ID")
		}
		a.installationID = inst.ID
	}
	var tok struct {
		Token       string            `json:"token"`
		ExpiresAt   time.Time         `json:"expires_at"`
		Permissions map[string]string `json:"permissions"`
	}
	err = app.call(ctx, http.MethodPost, "/app/installations/"+strconv.FormatInt(a.installationID, 10)+"/access_tokens",
		map[string][]string{"repositories": {a.name}}, &tok)
	switch statusOf(err) {
	case http.StatusNotFound:
		a.installationID = 0 // uninstalled since: look it up again next time
		return fmt.Errorf("forge: the GitHub App's installation is gone: %w", err)
	case http.StatusUnauthorized:
		return fmt.Errorf("forge: GitHub refused the App's JWT (wrong app ID or private key, or a clock far off): %w", err)
	}
	if err != nil {
		return err
	}
	if tok.Token == "" || strings.ContainsAny(tok.Token, " \t\r\n") {
		return errors.New("forge: GitHub answered no usable installation token")
	}
	a.token, a.obtained, a.expires, a.perms = tok.Token, a.api.now(), tok.ExpiresAt, tok.Permissions
	return nil
}
